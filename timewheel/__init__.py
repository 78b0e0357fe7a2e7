"""timewheel: a self-hosted, distributed service that calls HTTP URLs at their scheduled millisecond."""

__version__ = "0.1.0"
