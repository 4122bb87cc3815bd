"""autospec: keeps a speculative-decoding speculator fitted to live traffic."""

__version__ = "0.1.0"
