"""mwmq for Python: a client of mwmq's queue commands over redis-py (sync:
`Client`; asyncio: `mwmq.aio.AsyncClient`), typed replies, one exception
class per mwmq error, failover between addresses and safe retries; and a
worker (`Worker`) that runs a handler for each message with its lease
extended, ACK on success, NACK on an exception.

    import mwmq
    mq = mwmq.Client("redis://127.0.0.1:6380")
    mq.create_queue("jobs", exist_ok=True)
    mq.send("jobs", b"resize 17.jpg")
    for msg in mq.recv("jobs", wait_ms=1000):
        mq.ack(msg)
"""

from .aio_worker import AsyncWorker
from .client import Client
from .errors import (
    AuthError,
    BadRequest,
    ConnectionLost,
    Exists,
    LoginThrottled,
    MwmqError,
    NoAuth,
    NoPerm,
    NoQueue,
    OverQuota,
    TryAgain,
    WrongPass,
    WrongType,
)
from .progress import WorkerStats
from .types import DeadLetter, Message, QueueInfo, Schedule
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AsyncWorker",
    "AuthError",
    "BadRequest",
    "Client",
    "ConnectionLost",
    "DeadLetter",
    "Exists",
    "LoginThrottled",
    "Message",
    "MwmqError",
    "NoAuth",
    "NoPerm",
    "NoQueue",
    "OverQuota",
    "QueueInfo",
    "Schedule",
    "TryAgain",
    "Worker",
    "WorkerStats",
    "WrongPass",
    "WrongType",
    "__version__",
]
