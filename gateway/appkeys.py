"""The application's typed keys: its settings, its broker client, its model catalog and its in-flight count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.guard import InFlight
from zbatch.client import AsyncClient

if TYPE_CHECKING:
    from gateway.catalog import Catalog

CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncClient)
CATALOG: web.AppKey[Catalog] = web.AppKey("catalog")
IN_FLIGHT = web.AppKey("in_flight", InFlight)
