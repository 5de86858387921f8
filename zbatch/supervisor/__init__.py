"""``zbatch serve`` and the gateway's ``--processes``: supervisors that keep daemons running.

* :mod:`zbatch.supervisor.policy`: the rules, sans-I/O on an injected clock:
  which daemon to start, when to restart what (with backoff), when to give
  up, how to stop in order.
* :mod:`zbatch.supervisor.notify`: the receiving end of ``sd_notify``, so a
  supervisor hears its children's READY=1 and watchdog pings as systemd would.
* :mod:`zbatch.supervisor.shell`: the thin asyncio shell that starts the
  processes, signals them and reports back to the policy.
* :mod:`zbatch.supervisor.config`, :mod:`zbatch.supervisor.stack` and
  :mod:`zbatch.supervisor.serve`: ``zbatch serve``'s settings, the units and
  command lines of a whole stack, and the command itself.

Nothing here imports a daemon package: the daemons are started by module
name (``python -m broker``).
"""
