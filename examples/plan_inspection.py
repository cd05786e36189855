"""Inspect and edit the transformation plan before applying it.

The plan lists every pattern match with a stable id ``<pattern>@<module path>``, whether it
will be applied and why not. Toggle matches by glob, then apply the edited plan.
"""

from __future__ import annotations

import argparse

import torch
from _common import resnet

import embedl_dynamo
from embedl_dynamo.backends.tensorrt import TENSORRT_PATTERNS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()

    model = resnet(args.small)
    x = torch.randn(1, 3, 64, 64)
    plan = embedl_dynamo.get_transformation_plan(model, TENSORRT_PATTERNS, args=(x,))
    print(plan)

    skipped = plan.disable("*@layer4*", reason="keep layer4 unfused for a sensitivity study")
    print(f"\ndisabled {len(skipped)} matches in layer4:")
    for entry in skipped:
        print(f"  {entry.id}: {entry.reason}")
    print(
        "\nfused convolutions left in layer4:", [e.id for e in plan.select("*@layer4*") if e.apply]
    )

    result = embedl_dynamo.apply_transformation_plan(plan)
    with torch.no_grad():
        diff = float((result.model(x) - model(x)).abs().max())
    print(
        f"applied {result.report['applied_count']} matches, skipped "
        f"{result.report['skipped_count']}; max abs diff to the original: {diff:.2e}"
    )
    fused = sorted(
        {type(m).__name__ for m in result.model.modules() if "Fused" in type(m).__name__}
    )
    print("fused module types in the result:", fused)


if __name__ == "__main__":
    main()
