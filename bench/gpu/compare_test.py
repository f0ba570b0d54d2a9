"""compare.py's runner on a stand-in for a side (no GPU): the case's flags as a request, and a
long-lived process that answers, fails a case, dies or hangs, and is started again for the next case."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Side, request_of  # noqa: E402

# Answers {"n": k} with {"items_per_s": k, "pid": ...}; "fail" answers an error, "die" exits, "hang" sleeps.
STAND_IN = r'''
import json, os, sys, time
print("a library's message, not JSON", flush=True)
for line in sys.stdin:
    r = json.loads(line)
    if r.get("do") == "die": sys.stderr.write("stand-in: died on purpose\n"); sys.exit(3)
    if r.get("do") == "hang": time.sleep(60)
    out = {"error": "a failed case"} if r.get("do") == "fail" else {"items_per_s": r.get("n"), "pid": os.getpid()}
    print(json.dumps(out), flush=True)
'''


class Runner(unittest.TestCase):
    def setUp(self):
        self.side = Side("stand-in", [sys.executable, "-c", STAND_IN, "--"])

    def tearDown(self):
        self.side.stop()

    def test_flags_become_a_request(self):
        self.assertEqual(request_of(["--batch", "16", "--cuda-graphs"]), {"batch": 16, "cuda_graphs": True})
        self.assertEqual(request_of(["--compile", "reduce-overhead"]), {"compile": "reduce-overhead"})
        self.assertEqual(request_of([]), {})

    def test_one_process_answers_every_case(self):
        first, second = self.side.ask({"n": 1}, 30), self.side.ask({"n": 2}, 30)
        self.assertEqual((first["items_per_s"], second["items_per_s"]), (1, 2))
        self.assertEqual(first["pid"], second["pid"])

    def test_a_failed_case_starts_a_fresh_process_for_the_next(self):
        before = self.side.ask({"n": 1}, 30)["pid"]
        self.assertEqual(self.side.ask({"do": "fail"}, 30), {"error": "a failed case"})
        self.assertNotEqual(self.side.ask({"n": 2}, 30)["pid"], before)

    def test_a_process_that_dies_is_named_with_its_last_words(self):
        out = self.side.ask({"do": "die"}, 30)
        self.assertIn("exit code 3", out["error"])
        self.assertIn("died on purpose", out["error"])
        self.assertEqual(self.side.ask({"n": 5}, 30)["items_per_s"], 5)

    def test_a_hung_case_times_out_and_the_next_runs(self):
        self.assertEqual(self.side.ask({"do": "hang"}, 1), {"error": "timed out after 1 s"})
        self.assertEqual(self.side.ask({"n": 7}, 30)["items_per_s"], 7)


if __name__ == "__main__":
    unittest.main()
