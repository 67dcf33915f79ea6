"""Scaling, without a host: the plan of host counts, throughput read from recorded log
lines, the table's speed-up and efficiency."""
import pytest

from multihost.errors import ConfigError, RunFailed
from multihost.scale.measure import MetricReader, Samples, measure, parse_metric_is
from multihost.scale.plan import plan_counts
from multihost.scale.table import ScalePoint, ScaleTable


@pytest.mark.parametrize("hosts, counts", [(1, (1,)), (2, (1, 2)), (3, (1, 2, 3)),
                                           (4, (1, 2, 4)), (12, (1, 2, 4, 8, 12)),
                                           (64, (1, 2, 4, 8, 16, 32, 64))])
def test_the_plan_is_powers_of_two_then_every_host(hosts, counts):
    assert plan_counts(hosts) == counts


def test_counts_given_are_measured_ascending_without_repeats():
    assert plan_counts(4, "3,1,3") == (1, 3)


@pytest.mark.parametrize("text", ["", "1,,2", "two", "0,1", "1,5", "-1"])
def test_bad_counts_are_one_line_naming_the_range(text):
    with pytest.raises(ConfigError) as err:
        plan_counts(4, text)
    assert "--counts" in str(err.value) and "1,4" in err.value.fix


def samples_of(lines_by_rank, regex=None):
    samples = Samples(MetricReader(regex))
    for rank, lines in lines_by_rank.items():
        samples.add(rank, lines, 100.0)
    return samples


def fleet(step, speed):
    return f"epoch: 0, step:{step}, train_loss: 0.5, total time cost = 0.1, speed: {speed}"


def test_a_speed_every_rank_prints_alike_is_the_jobs_taken_once():
    lines = [fleet(s, v) for s, v in [(10, 100.0), (20, 900.0), (30, 1000.0), (40, 1010.0)]]
    found = measure(samples_of({0: lines, 1: lines}), world_size=2)
    # the first quarter (step 10) is warm-up; the median of the rest; not summed over ranks
    assert (found.value, found.rule, found.ranks) == (1000.0, "global", 2)


def test_each_ranks_own_speed_is_summed():
    found = measure(samples_of({0: [fleet(s, v) for s, v in enumerate([50, 290, 300, 310])],
                                1: [fleet(s, v) for s, v in enumerate([60, 300, 310, 320])]}),
                    world_size=2)
    assert (found.value, found.rule) == (610.0, "per-rank")


def test_per_rank_speed_printed_on_rank_0_only_counts_every_rank():
    # PaddleOCR logs on rank 0 only; its ips is that card's: the job's is 4 cards' worth
    ocr = "epoch: [1/500], global_step: 10, lr: 0.001, loss: 1.23, ips: 80.5 samples/s"
    found = measure(samples_of({0: [ocr]}), world_size=4, rule="per-rank")
    assert found.value == pytest.approx(322.0)


def test_one_rank_printing_among_many_is_asked_about_not_guessed():
    with pytest.raises(RunFailed) as err:
        measure(samples_of({0: [fleet(1, 80.0)]}), world_size=4, run_id="R")
    assert "--metric-is global" in err.value.fix and "--metric-is per-rank" in err.value.fix


def test_a_run_without_throughput_says_how_to_print_or_read_one():
    with pytest.raises(RunFailed) as err:
        measure(samples_of({0: ["loading data", "step 3 done"]}), world_size=1, run_id="R")
    assert "printed no throughput" in str(err.value) and "--metric" in err.value.fix


def test_the_launchers_own_lines_are_not_a_ranks():
    samples = samples_of({-1: [fleet(1, 5.0)], 0: [fleet(1, 7.0)]})
    assert measure(samples, world_size=1).value == 7.0


def test_metric_regex_reads_its_first_group():
    lines = ["step 1 tokens/sec=1,000.5", "step 2 tokens/sec=1,200.5", "loss 0.3",
             "step 3 tokens/sec=1,300.5", "step 4 tokens/sec=1,400.5"]
    found = measure(samples_of({0: lines}, r"tokens/sec=([\d,.]+)"), world_size=1)
    assert found.value == 1300.5 and found.samples == 3


@pytest.mark.parametrize("regex, said", [("(", "not a regular expression"),
                                         ("ips: [0-9.]+", "has no group")])
def test_a_bad_metric_regex_is_refused_before_anything_runs(regex, said):
    with pytest.raises(ConfigError) as err:
        MetricReader(regex)
    assert said in str(err.value)


def test_a_group_that_is_no_number_is_no_sample():
    assert MetricReader(r"speed: (\w+)").read("speed: fast")[1] is None


def test_metric_is_takes_three_words():
    assert parse_metric_is("per-rank") == "per-rank"
    with pytest.raises(ConfigError):
        parse_metric_is("sum")


def table(*throughputs, procs=2):
    points = tuple(ScalePoint(n, procs, t, f"run{n}") for n, t in throughputs)
    return ScaleTable("train.py", "speed", points)


def test_speedup_and_efficiency_are_over_one_machine():
    rows = table((2, 1540.0), (1, 1000.0), (4, 3000.0)).rows()
    assert [r.point.machines for r in rows] == [1, 2, 4]
    assert [round(r.speedup, 2) for r in rows] == [1.0, 1.54, 3.0]
    assert [round(r.efficiency, 2) for r in rows] == [1.0, 0.77, 0.75]   # the docs' 76%-ish


def test_without_one_machine_the_fewest_is_the_baseline():
    rows = table((2, 1000.0), (4, 1800.0)).rows()
    assert (rows[1].speedup, rows[1].efficiency) == (1.8, 0.9)


def test_json_has_every_column_per_point():
    document = table((1, 1000.0), (2, 1900.0)).to_json()
    assert document["baseline_machines"] == 1
    second = document["points"][1]
    assert {"machines", "nproc_per_node", "processes", "throughput", "speedup", "efficiency",
            "run_id"} <= set(second)
    assert (second["processes"], second["speedup"], second["efficiency"]) == (4, 1.9, 0.95)
