"""Test support: real redis-server processes and a real local HTTP receiver (loopback only)."""

from .receiver import Arrival, Receiver, Reply, ThreadedReceiver
from .redis_server import (
    RedisCluster,
    RedisServer,
    free_port,
    redis_cli_binary,
    redis_server_binary,
)

__all__ = [
    "Arrival",
    "Receiver",
    "RedisCluster",
    "RedisServer",
    "Reply",
    "ThreadedReceiver",
    "free_port",
    "redis_cli_binary",
    "redis_server_binary",
]
