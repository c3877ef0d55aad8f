"""Layer ids: EAGLE-3's default layers, and how each engine numbers the same block outputs."""
import pytest

from kimi_eagle.eagle3.layers import check_layer_ids, default_layer_ids, engine_layer_ids, layer_ids_from_engine


def test_default_layer_ids_follow_eagle3_and_stay_distinct_for_small_models():
    assert default_layer_ids(61) == (1, 29, 57)  # Kimi-K2.5
    assert default_layer_ids(32) == (1, 15, 28)  # Llama-3-8B: vLLM's (2, 16, 29) minus one
    assert default_layer_ids(5) == (1, 2, 3)  # stories260K: (1, 1, 1) would collapse
    for n in range(3, 80):
        a, b, c = default_layer_ids(n)
        assert 0 <= a < b < c < n


def test_layer_ids_must_be_three_distinct_blocks_of_the_target():
    assert check_layer_ids([1, 2, 3], 5) == (1, 2, 3)
    for bad in ([1, 2], [1, 1, 3], [1, 2, 5], [-1, 2, 3]):
        with pytest.raises(ValueError, match="3 distinct block indices"):
            check_layer_ids(bad, 5)


def test_engine_layer_id_conventions():
    assert engine_layer_ids([1, 29, 57], "vllm") == [2, 30, 58]  # capture before block j = output of j-1
    assert engine_layer_ids([1, 29, 57], "sglang") == [1, 29, 57]  # first id 1: SGLang adds 1 itself
    assert engine_layer_ids([2, 4, 6], "sglang") == [3, 5, 7]  # otherwise SGLang uses ids as "before block j"
    with pytest.raises(ValueError, match="block output 0"):
        engine_layer_ids([0, 2, 3], "sglang")
    with pytest.raises(ValueError, match="unknown engine"):
        engine_layer_ids([1, 2, 3], "tgi")


def test_foreign_engine_ids_are_read_as_capture_before_block_j():
    assert layer_ids_from_engine([2, 30, 58]) == [1, 29, 57]
    for ids in ([0, 1, 2], [1, 29, 57], [3, 9, 20]):
        assert layer_ids_from_engine(engine_layer_ids(ids, "vllm")) == ids


def test_kimi_layer_ids_in_every_trainer_convention():
    from kimi_eagle.eagle3.layers import convention_table

    table = convention_table(61)
    assert table["kimi_block_output"] == [1, 29, 57]
    assert table["sglang_specforge"] == [1, 29, 57]  # SpecForge's [1, n//2-1, n-4]; SGLang adds the 1
    assert table["vllm_speculators"] == [2, 30, 58]  # speculators' [2, n//2, n-3]
    assert table["speculators_file_layers"] == [2, 30, 58, 61]


@pytest.mark.parametrize("trainer", ["kimi", "sglang", "specforge", "vllm", "speculators"])
@pytest.mark.parametrize("ids", [(1, 29, 57), (2, 30, 58), (0, 30, 60)])
def test_trainer_layer_ids_round_trip(trainer, ids):
    from kimi_eagle.eagle3.layers import layer_ids_from_trainer, trainer_layer_ids

    if trainer in ("sglang", "specforge") and ids[0] == 0:
        with pytest.raises(ValueError):
            trainer_layer_ids(ids, 61, trainer)
        return
    assert layer_ids_from_trainer(trainer_layer_ids(ids, 61, trainer), 61, trainer) == list(ids)
