"""Logging set-up shared by the CLI, jobs and tests."""

import logging
import os


def setup_logging(level: str | None = None) -> logging.Logger:
    level = (level or os.environ.get("CQG_RAY_LOG", "INFO")).upper()
    logger = logging.getLogger("cqg_ray")
    if not logger.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(h)
    logger.setLevel(level)
    logger.propagate = False
    return logger
