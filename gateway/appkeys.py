"""The application's typed keys: its settings and its broker client, read by the handlers and the parsers."""

from __future__ import annotations

from aiohttp import web

from gateway.config import GatewayConfig
from zbatch.client import AsyncClient

CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncClient)
