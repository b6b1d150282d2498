"""Logging set-up shared by the CLI, jobs and tests."""

import logging
import os

# Ray Data's loggers and the lines they log before raising an error from a task's own code (a UserCodeException)
RAY_DATA_ABORT_LOGGER = "ray.data._internal.execution.streaming_executor_state"
RAY_DATA_EXCEPTIONS_LOGGER = "ray.data.exceptions"


class DropRayDataTaskErrorNotes(logging.Filter):
    """Drops the ERROR lines Ray Data logs before it raises an error from a task's own code: "An exception was raised
    from a task of operator ... set DataContext.max_errored_blocks" (logged without a traceback only for such an
    error) and, once a process, "Exception occurred in user code, with the abbreviated stack trace below". cqg-ray
    says the error itself (a corpus or artifact error in one `error:` line, anything else with its traceback), so
    they stood alone above it with advice that does not apply. Ray Data's own failures, logged with a traceback, pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Exception occurred in user code"):
            return False
        return not (message.startswith("An exception was raised from a task of operator") and "will now abort" in message
                    and record.exc_info is None)


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def setup_logging(level: str | None = None) -> logging.Logger:
    """The cqg_ray logger at ``level`` (else $CQG_RAY_LOG, else INFO), writing to stderr through one console handler
    of its own (added once; other handlers on it are left alone), and not again through the root logger's; Ray Data's
    notes before a task's error dropped (``DropRayDataTaskErrorNotes``)."""
    level = (level or os.environ.get("CQG_RAY_LOG", "").strip() or "INFO").upper()
    if level not in LEVELS:
        from cqg_ray.config import ConfigError

        raise ConfigError(f"CQG_RAY_LOG={os.environ.get('CQG_RAY_LOG')!r}: give one of {', '.join(LEVELS)}")
    logger = logging.getLogger("cqg_ray")
    if not any(type(h) is logging.StreamHandler for h in logger.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(h)
    logger.setLevel(level)
    logger.propagate = False
    for name in (RAY_DATA_ABORT_LOGGER, RAY_DATA_EXCEPTIONS_LOGGER):
        ray_data = logging.getLogger(name)
        if not any(isinstance(f, DropRayDataTaskErrorNotes) for f in ray_data.filters):
            ray_data.addFilter(DropRayDataTaskErrorNotes())
    return logger
