"""Load generation: the closed and open loops, the calls they make, and load from several processes.

``loops`` holds the one load generator and its statistics; ``calls`` the requests it sends (HTTP,
the ZeroMQ client, pre-encoded payloads); ``processes`` spreads a closed loop over child processes
for rates one Python process cannot drive; ``probe`` times a server's answers from a process of its
own while something else floods it.
"""
