"""Thin aiohttp handlers: decode, validate, submit to the runtime, encode."""
