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



def test_setup_logging_drops_ray_datas_notes_before_a_tasks_error_and_nothing_else():
    """Ray Data logs two ERROR lines before it raises an error from a task's code (ray/data/exceptions.py and
    streaming_executor_state.py); the CLI says the error itself. Its own failures, logged with a traceback, pass."""
    from cqg_ray.log import RAY_DATA_ABORT_LOGGER, RAY_DATA_EXCEPTIONS_LOGGER, DropRayDataTaskErrorNotes

    loggers = [logging.getLogger(RAY_DATA_EXCEPTIONS_LOGGER), logging.getLogger(RAY_DATA_ABORT_LOGGER)]
    saved, seen = [list(lg.filters) for lg in loggers], []
    handler = logging.Handler()
    handler.emit = seen.append
    for lg in loggers:
        lg.addHandler(handler)
    try:
        setup_logging("INFO")
        setup_logging("INFO")
        assert [sum(isinstance(f, DropRayDataTaskErrorNotes) for f in lg.filters) for lg in loggers] == [1, 1]
        exceptions, abort = loggers
        exceptions.error("Exception occurred in user code, with the abbreviated stack trace below. The Ray Data internal "
                         "stack frames are omitted from stdout.")
        exceptions.error("Exception occurred in Ray Data or Ray Core internal code. If you continue to see this error, ...")
        exceptions.error("Full stack trace:\n%s", "CorpusError: a.jsonl: no column 'text'")
        note = ('An exception was raised from a task of operator "ReadFiles". Dataset execution will now abort. To ignore '
                "this exception and continue, set DataContext.max_errored_blocks.")
        abort.error(note)
        try:
            raise RuntimeError("an internal failure")
        except RuntimeError as e:
            abort.error(note, exc_info=e)
        abort.error('An exception was raised from a task of operator "ReadFiles". Ignoring this exception with remaining '
                    "max_errored_blocks=2.")
        assert [(r.name, r.getMessage(), r.exc_info is not None) for r in seen] == [
            (RAY_DATA_EXCEPTIONS_LOGGER, "Exception occurred in Ray Data or Ray Core internal code. If you continue to see this error, ...", False),
            (RAY_DATA_EXCEPTIONS_LOGGER, "Full stack trace:\nCorpusError: a.jsonl: no column 'text'", False),
            (RAY_DATA_ABORT_LOGGER, note, True),
            (RAY_DATA_ABORT_LOGGER, 'An exception was raised from a task of operator "ReadFiles". Ignoring this exception with '
                                    "remaining max_errored_blocks=2.", False)]
    finally:
        for lg, filters in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.filters[:] = filters
