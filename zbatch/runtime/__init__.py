"""What every zbatch daemon runs on: settings, logging, sd_notify, the event loop, metrics,
CURVE, ZeroMQ sockets and the daemon skeleton."""
