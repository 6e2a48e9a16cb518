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
