"""The application's typed keys: its settings, its broker client and its in-flight count.

The model catalog's key is :data:`gateway.catalog.CATALOG`, beside its type, as the metrics' is beside theirs.
"""

from __future__ import annotations

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.guard import InFlight
from zbatch.client import AsyncClient

CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncClient)
IN_FLIGHT = web.AppKey("in_flight", InFlight)
