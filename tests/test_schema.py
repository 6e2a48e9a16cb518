"""One metric schema (harness.io.schema) for the writer (RunDir) and the reader (analysis)."""
import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf

from analysis.load import HYPERPARAMETERS, METRIC_COLUMNS, VARIANT_KEYS
from harness.io import RunDir, schema


def test_schema_has_the_variant_columns_as_required_strings():
    assert schema.METRIC_COLUMNS["update"] == pa.string()
    assert schema.METRIC_COLUMNS["loss_agg"] == pa.string()
    assert {"update", "loss_agg", "run_id", "task", "estimator", "seed", "iteration"} <= set(schema.REQUIRED)
    assert set(schema.REQUIRED) <= set(schema.METRIC_COLUMNS)
    assert set(schema.STRING_COLUMNS) == {"run_id", "task", "estimator", "update", "loss_agg"}
    assert schema.missing_required({"run_id": "r", "update": None}) == [
        k for k in schema.REQUIRED if k != "run_id"]


def test_reader_lists_the_writer_columns():
    assert METRIC_COLUMNS == list(schema.METRIC_COLUMNS)
    assert HYPERPARAMETERS == list(schema.HYPERPARAMETERS)
    assert VARIANT_KEYS == ["update", "loss_agg"]


def test_writer_writes_every_schema_column_with_its_type(tmp_path):
    cfg = OmegaConf.create({"results_dir": str(tmp_path), "seed": 3, "task": {"name": "t"},
                            "estimator": "rloo"})
    run = RunDir(cfg)
    run.path.mkdir(parents=True, exist_ok=True)
    run.log({"run_id": "r", "task": "t", "estimator": "rloo", "seed": 3, "iteration": 1,
             "update": "pg", "loss_agg": "token_mean", "extra_count": 2, "extra_name": "x"})
    run.flush()
    table = pq.read_table(run.path / "metrics.parquet")
    got = dict(zip(table.schema.names, table.schema.types))
    assert list(got)[:len(schema.METRIC_COLUMNS)] == list(schema.METRIC_COLUMNS)
    assert {k: got[k] for k in schema.METRIC_COLUMNS} == schema.METRIC_COLUMNS
    assert got["extra_count"] == pa.int64() and got["extra_name"] == pa.string()
    row = table.to_pylist()[0]
    assert row["update"] == "pg" and row["loss_agg"] == "token_mean" and row["gamma"] is None


def test_per_prompt_columns_are_registered_with_their_type(tmp_path):
    assert schema.column_type("update_prompt3") == pa.float64()
    assert schema.column_type("success_prompt12") == pa.float64()
    assert schema.column_type("update_promptx") is None and schema.column_type("J_prompt0") is None
    assert schema.prompt_column("update_prompt", 2) == "update_prompt2"
    assert schema.METRIC_COLUMNS["exact_entropy"] == pa.float64()
    cfg = OmegaConf.create({"results_dir": str(tmp_path), "seed": 0, "task": {"name": "t"}, "estimator": "grpo"})
    run = RunDir(cfg)
    run.path.mkdir(parents=True, exist_ok=True)
    # an integer-valued update size (0: the prompt's rows did not move) is still a float column
    run.log({"run_id": "r", "task": "t", "estimator": "grpo", "seed": 0, "iteration": 1, "update": "pg",
             "loss_agg": "token_mean", "update_prompt0": 0, "success_prompt0": None})
    run.flush()
    got = dict(zip(*(lambda s: (s.names, s.types))(pq.read_table(run.path / "metrics.parquet").schema)))
    assert got["update_prompt0"] == pa.float64() and got["success_prompt0"] == pa.float64()


def test_flushes_as_rows_come_write_the_file_one_conversion_of_all_rows_writes(tmp_path):
    """RunDir.flush converts only the rows logged since its last flush; the file after each flush
    must be byte for byte the one a single conversion of every row so far gives (pq.write_table of
    schema.rows_table), through a new extra column (int, then a string one) and a replaced row list."""
    def made(seed):
        cfg = OmegaConf.create({"results_dir": str(tmp_path), "seed": seed, "task": {"name": "t"},
                                "estimator": "rloo"})
        run = RunDir(cfg)
        run.path.mkdir(parents=True, exist_ok=True)
        return run

    def row(i, **extra):
        return {"run_id": "r", "task": "t", "estimator": "rloo", "seed": 3, "iteration": i, "update": "pg",
                "loss_agg": "token_mean", "wall_time_s": 0.1 * i, "eval_return": None if i % 3 else float(i),
                **extra}

    def once(rows):
        sink = pa.BufferOutputStream()
        pq.write_table(schema.rows_table(rows), sink)
        return sink.getvalue().to_pybytes()

    run = made(3)
    plan = [[row(1), row(2)], [row(3)], [], [row(4, extra_count=4), row(5)], [row(6, extra_name="x")],
            [row(i) for i in range(7, 30)]]
    for batch in plan:
        for r in batch:
            run.log(r)
        run.flush()
        assert (run.path / "metrics.parquet").read_bytes() == once(run.rows), len(run.rows)
    got = pq.read_table(run.path / "metrics.parquet")
    assert got.column("iteration").to_pylist() == list(range(1, 30))
    assert got.column("extra_count").to_pylist() == [None] * 3 + [4] + [None] * 25
    assert got.column("extra_name").to_pylist()[5] == "x"
    run.resume_rows(run.rows[:4])  # a checkpoint's rows: a new list, shorter
    assert (run.path / "metrics.parquet").read_bytes() == once(run.rows)
    assert pq.read_table(run.path / "metrics.parquet").column("iteration").to_pylist() == [1, 2, 3, 4]
    run.log(row(5))
    run.flush()
    assert (run.path / "metrics.parquet").read_bytes() == once(run.rows)
    run.discard_progress()
    run.log(row(1, other=2.5))
    run.flush()
    assert (run.path / "metrics.parquet").read_bytes() == once(run.rows)
    assert "extra_count" not in pq.read_table(run.path / "metrics.parquet").schema.names
    run.resume_rows([row(7), row(8), row(9)])  # another list, longer than the one flushed
    assert pq.read_table(run.path / "metrics.parquet").column("iteration").to_pylist() == [7, 8, 9]
    assert (run.path / "metrics.parquet").read_bytes() == once(run.rows)
