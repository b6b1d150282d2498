"""The CLI's logging set-up (`cqg_ray.log`), and caplog hearing cqg_ray's records after it (tests/conftest.py)."""

import logging

from cqg_ray.log import setup_logging


def test_setup_logging_adds_its_console_handler_once_and_caplog_still_hears_the_records(caplog):
    logger = logging.getLogger("cqg_ray")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    try:
        setup_logging("WARNING")
        setup_logging("info")
        assert [type(h) for h in logger.handlers].count(logging.StreamHandler) == 1
        assert (logger.propagate, logger.level) == (False, logging.INFO)  # not again through the root logger's handlers
        logging.getLogger("cqg_ray.somewhere").warning("said once")
        assert [(r.name, r.getMessage()) for r in caplog.records] == [("cqg_ray.somewhere", "said once")]
    finally:
        logger.handlers[:], logger.propagate, logger.level = handlers, propagate, level
