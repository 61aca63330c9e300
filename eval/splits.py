"""Held-out splits by a query metadata field (`--split-by paragraph`): every query whose field
has one value falls on one side, train, validation or test, in every folder and language.

A value's side is a pure function of the value and the seed (a SHA-256 bucket), not of the
other values present, so `ragrank finetune` on eleven languages merged and `ragrank eval` on
one language put each paragraph on the same side, and no question of a test paragraph, in
any language, is ever trained or validated on. The corpus is never split: distractors stay."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragrank.errors import DocumentError, SettingsError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ragrank.beir import BeirDataset

SIDES = ("train", "validation", "test")
SPLIT_BY_HELP = (
    "split the queries by this field of their metadata (XQuAD-R's `paragraph`): all queries "
    "sharing a value, in every folder, fall on one side (train, validation or test)"
)
SPLIT_SEED_HELP = "seed of --split-by (the same seed gives the same sides in eval and finetune)"
TEST_SHARE_HELP = "with --split-by, the share of values whose queries are test queries"
VALIDATION_SHARE_HELP = "with --split-by, the share of values whose queries validate"


@dataclass(frozen=True)
class GroupSplit:
    """Which side each value of a query metadata field is on."""

    field: str
    seed: int
    test_share: float
    validation_share: float

    def __post_init__(self) -> None:
        if not self.field:
            raise SettingsError("--split-by names no field")
        if not 0 < self.test_share < 1:
            raise SettingsError("--test-share must be in (0, 1)")
        if not 0 <= self.validation_share < 1 - self.test_share:
            raise SettingsError("--validation-share must be in [0, 1 - --test-share)")

    def side_of(self, value: str) -> str:
        """`test`, `validation` or `train`, from the value's seeded hash bucket in [0, 1)."""
        digest = hashlib.sha256(f"{self.seed}\0{value}".encode()).digest()
        bucket = int.from_bytes(digest[:8], "big") / 2**64
        if bucket < self.test_share:
            return "test"
        if bucket < self.test_share + self.validation_share:
            return "validation"
        return "train"

    def value_of(self, dataset: BeirDataset, qid: str) -> str:
        """The query's field, or a `DocumentError` naming the query and the field."""
        value = dataset.query_metadata.get(qid, {}).get(self.field)
        if value is None:
            raise DocumentError(
                f"{dataset.name}: query {qid!r} has no metadata field {self.field!r} to split "
                "by (--split-by); every judged query needs one"
            )
        return value

    def queries(self, dataset: BeirDataset, side: str, qids: Iterable[str]) -> list[str]:
        """The ids among `qids` whose value is on `side`, in their order."""
        if side not in SIDES:
            raise SettingsError(f"split side must be one of {', '.join(SIDES)}, not {side!r}")
        return [qid for qid in qids if self.side_of(self.value_of(dataset, qid)) == side]

    def groups(self, dataset: BeirDataset, qids: Iterable[str]) -> dict[str, list[str]]:
        """Side → the sorted values of `qids` on it: the split as written into reports."""
        values = sorted({self.value_of(dataset, qid) for qid in qids})
        sides: dict[str, list[str]] = {side: [] for side in SIDES}
        for value in values:
            sides[self.side_of(value)].append(value)
        return sides

    def describe(self, dataset: BeirDataset, qids: Iterable[str]) -> dict[str, Any]:
        """The split's definition and its sides' values, for a report or a run folder."""
        return {
            "field": self.field,
            "seed": self.seed,
            "test_share": self.test_share,
            "validation_share": self.validation_share,
            "groups": self.groups(dataset, qids),
        }


def group_split(options: Any) -> GroupSplit | None:
    """The split an options object asks for (`split_by`, `split_seed`, `test_share`, and
    `validation_share` where it has one), or None without `--split-by`."""
    field: str | None = options.split_by
    if field is None:
        return None
    return GroupSplit(
        field=field,
        seed=options.split_seed,
        test_share=options.test_share,
        validation_share=getattr(options, "validation_share", 0.0),
    )


def check_sides(sides: Mapping[str, list[str]], *, test_at_least: int = 1) -> None:
    """Refuse a split that leaves a side the run needs empty."""
    if len(sides["test"]) < test_at_least:
        raise SettingsError(
            f"--split-by leaves {len(sides['test'])} values on the test side; raise --test-share"
        )
