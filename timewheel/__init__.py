"""timewheel: a self-hosted, distributed service that calls HTTP URLs at their millisecond."""

__version__ = "0.1.0"
