"""``vagent judge-audit``: how well two judges agree on a run's saved descriptions.

Light on purpose: judges (and openai, sentence-transformers) are imported when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys


def _audit(args: argparse.Namespace) -> int:
    from vagent.config import ConfigError, from_mapping
    from vagent.rewards.audit import format_report, run_audit
    from vagent.rewards.llm import LLMJudgeError
    from vagent.rewards.reasoning import JUDGES, ReasoningRewardConfig

    names = tuple(j.strip() for j in args.judges.split(",") if j.strip())
    if len(names) != 2 or any(n not in JUDGES for n in names):
        print(f"vagent judge-audit: error: --judges takes two of {', '.join(JUDGES)} separated by a comma "
              f"(the first is the reference), got {args.judges!r}", file=sys.stderr)
        return 2
    llm = {"model": args.llm_model, "mode": args.llm_mode, "api_key_env": args.llm_api_key_env}
    if args.llm_base_url:
        llm["base_url"] = args.llm_base_url
    try:
        config = from_mapping(ReasoningRewardConfig, {"llm": llm}, where="judge-audit")
        report = run_audit(args.path, names, n=args.n, seed=args.seed, threshold=args.threshold, config=config,
                           env_name=args.env)
    except (ConfigError, ValueError, FileNotFoundError, ImportError, LLMJudgeError) as exc:
        print(f"vagent judge-audit: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report.to_dict(), fh, indent=2)
        print(f"wrote {args.json}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "judge-audit", help="compare two reasoning judges on a run's saved descriptions",
        description="Sample judged fields (<observation>/<prediction> with the saved states) from a run's "
                    "rollouts/*.jsonl (or any JSONL of episodes or turns), score them with two judges and "
                    "report their agreement: accuracy after thresholding, confusion matrix, Cohen's kappa, "
                    "mean absolute difference. The first judge is the reference. See docs/rewards.md.")
    p.add_argument("path", help="run directory, folder of *.jsonl, or a JSONL file")
    p.add_argument("--judges", default="rule,llm", help="two judges, reference first: rule, llm, embedding (default rule,llm)")
    p.add_argument("--n", type=int, default=200, help="fields to sample (default 200)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--threshold", type=float, default=0.5, help="score at or above which a field counts as correct (default 0.5)")
    p.add_argument("--env", default=None, help="env name for records that lack 'env_name'")
    p.add_argument("--llm-base-url", default="", help="OpenAI-compatible base URL of the llm judge (default http://127.0.0.1:8000/v1)")
    p.add_argument("--llm-model", default="gpt-4.1-nano", help="model of the llm judge (default gpt-4.1-nano)")
    p.add_argument("--llm-mode", default="yesno", choices=("yesno", "parse"), help="llm judge mode (default yesno)")
    p.add_argument("--llm-api-key-env", default="OPENAI_API_KEY", help="environment variable with the API key")
    p.add_argument("--json", default="", help="also write the report as JSON to this path")
    p.set_defaults(func=_audit)
