"""Logging set-up shared by the CLI, jobs and tests."""

import logging
import os


def setup_logging(level: str | None = None) -> logging.Logger:
    """The cqg_ray logger at ``level`` (else $CQG_RAY_LOG, else INFO), writing to stderr through one console handler
    of its own (added once; other handlers on it are left alone), and not again through the root logger's."""
    level = (level or os.environ.get("CQG_RAY_LOG", "INFO")).upper()
    logger = logging.getLogger("cqg_ray")
    if not any(type(h) is logging.StreamHandler for h in logger.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(h)
    logger.setLevel(level)
    logger.propagate = False
    return logger
