"""LLM proposers: SEARCH/REPLACE diffs, full rewrites of the evolve blocks, and crossover of programs.

Exploring mixes in more rewrites and crossovers at a higher temperature; exploiting asks mostly for
small diffs at a lower one. Every call is stored with its prompt, reply, tokens and dollars; a reply that
cannot be used (no directive, a SEARCH that does not match, an edit to frozen code) goes back to the
model with the reason, up to llm.patch_retries times. The budget is checked before every call.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cuco.evolve.bandit import arm_stats, choose
from cuco.evolve.database import Database
from cuco.evolve.prompting import meta_prompt, recommendations_from, user_prompt
from cuco.evolve.proposers import Proposal, ProposalContext, ProposalFailed, SearchStopped, register
from cuco.llm import LLMError, make_client
from cuco.llm.pricing import cost_usd, price_of
from cuco.paths import cuco_home
from cuco.program.directives import parse_directive
from cuco.program.edits import PatchError, apply_change
from cuco.program.prompts import retry_prompt, system_prompt
from cuco.workload.spec import WorkloadSpec

META_SYSTEM = "You review performance experiments and distil them into short, concrete advice."
KNOWLEDGE_LINES = 10  # recommendations from earlier runs shown in a prompt
# (diff, rewrite, crossover) weights per phase: wide moves while exploring, small ones while exploiting.
MIX = {"explore": (0.3, 0.5, 0.2), "exploit": (0.8, 0.1, 0.1)}


@register
class LLMProposer:
    name = "llm"
    near_duplicates = True  # free-form code: reject near copies by embedding similarity

    def __init__(self, spec: WorkloadSpec, machine: dict[str, Any] | None = None, *, cfg=None, db: Database,
                 shape: str, run_dir: Path | None = None, **_: Any) -> None:
        self.spec, self.machine, self.db, self.shape, self.run_dir = spec, machine or {}, db, shape, run_dir
        self.cfg = cfg.llm
        self.models = [str(m) for m in self.cfg.models] or [self.cfg.model]
        try:
            self.clients = {m: make_client(replace(self.cfg, model=m)) for m in self.models}
        except LLMError as exc:
            raise ValueError(str(exc)) from None
        for m in self.models:
            if self.cfg.budget_usd > 0 and price_of(m, self.cfg.pricing) is None:
                raise ValueError(f"llm.budget_usd is set but model {m!r} has no price: add "
                                 f"[llm.pricing] \"{m}\" = [input, output] dollars per million tokens")
        self.client = self.clients[self.models[0]]  # summaries use the first model
        self.failures = 0
        self.knowledge_path = cuco_home() / "knowledge" / f"{spec.name}.md"
        earlier = self.knowledge_path.read_text().splitlines() if self.knowledge_path.is_file() else []
        self.earlier = [line for line in earlier if line.startswith("- ")][-KNOWLEDGE_LINES:]

    def recommendations(self) -> str:
        latest = self.db.latest_summary()
        parts = []
        if latest and latest["recommendations"]:
            parts.append(f"This run, after {latest['after_evaluations']} evaluations:\n"
                         + "\n".join(f"- {r}" for r in latest["recommendations"]))
        if self.earlier:
            parts.append("Earlier runs of this workload:\n" + "\n".join(self.earlier))
        return "\n".join(parts)

    async def summarize_if_due(self, best_bound: float | None) -> None:
        """Every meta_interval evaluations: what worked, what failed, at most 5 recommendations."""
        k = self.cfg.meta_interval
        done = list(self.db.iter_done())
        if k <= 0 or len(done) < k:
            return
        after = len(done) - len(done) % k
        latest = self.db.latest_summary()
        if latest and latest["after_evaluations"] >= after:
            return
        self._check_budget()
        prompt = meta_prompt(self.spec, self.shape, best_bound, done)
        try:
            reply = await self.client.complete(META_SYSTEM, prompt, 0.3, 2048)
        except LLMError as exc:  # a missing summary costs advice, not the search
            self.db.log_call(kind="meta", provider=self.client.provider, model=self.client.model, status="error",
                             error=str(exc), prompt=prompt)
            return
        recs = recommendations_from(reply.text)
        self.db.log_call(kind="meta", provider=self.client.provider, model=reply.model,
                         status="ok" if recs else "rejected", error=None if recs else "no '- ' recommendation lines",
                         input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                         cost_usd=cost_usd(reply.model, reply.input_tokens, reply.output_tokens, self.cfg.pricing),
                         seconds=reply.seconds, prompt=prompt, reply=reply.text)
        if not recs:
            return
        self.db.add_summary(after, reply.text, recs)
        if self.cfg.knowledge:
            self.knowledge_path.parent.mkdir(parents=True, exist_ok=True)
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
            with open(self.knowledge_path, "a") as f:
                f.write(f"\n## {stamp}, shape {self.shape}, after {after} evaluations ({self.run_dir})\n"
                        + "".join(f"- {r}\n" for r in recs))

    def _check_budget(self) -> None:
        spent = self.db.llm_totals()["cost_usd"]
        if self.cfg.budget_usd > 0 and spent >= self.cfg.budget_usd:
            raise SearchStopped(f"LLM budget reached: ${spent:.4f} of ${self.cfg.budget_usd:.4f}")

    def _fail(self, reason: str) -> ProposalFailed:
        self.failures += 1
        if self.failures >= self.cfg.max_consecutive_failures:
            return SearchStopped(f"{self.failures} proposals in a row without a usable reply; last: {reason}",
                                 failed=True)
        return ProposalFailed(reason)

    async def propose(self, ctx: ProposalContext) -> Proposal:
        client = self.clients[choose(arm_stats(self.db, self.models))] if len(self.models) > 1 else self.client
        kind = ctx.rng.choices(("diff", "rewrite", "crossover"), weights=MIX[ctx.phase], k=1)[0]
        if kind == "crossover" and not ctx.inspirations:
            kind = "rewrite"
        temperature = self.cfg.temperature_explore if ctx.phase == "explore" else self.cfg.temperature_exploit
        best = ctx.best
        await self.summarize_if_due(best.bound_ms if best else None)
        system = system_prompt(self.spec, self.shape, best.bound_ms if best else None, best.median_ms if best else None,
                               self.machine, self.recommendations(), ctx.parent.language)
        user = user_prompt(kind, ctx.parent, ctx.inspirations[:3] if kind != "diff" else ctx.inspirations[:2])
        calls: list[int] = []
        error = None
        for _ in range(1 + self.cfg.patch_retries):
            self._check_budget()
            prompt = user + (retry_prompt(error) if error else "")
            try:
                reply = await client.complete(system, prompt, temperature, self.cfg.max_tokens)
            except LLMError as exc:
                calls.append(self.db.log_call(kind=kind, provider=client.provider, model=client.model,
                                              status="error", error=str(exc), prompt=prompt))
                if exc.kind in ("auth", "model"):  # asking again cannot help
                    raise SearchStopped(str(exc), failed=True) from None
                raise self._fail(str(exc)) from None
            cost = cost_usd(reply.model, reply.input_tokens, reply.output_tokens, self.cfg.pricing)
            try:
                directive = parse_directive(reply.text)
                code = apply_change(ctx.parent.code, reply.text)
                if code == ctx.parent.code:
                    raise PatchError("the change leaves the program exactly as it was")
            except PatchError as exc:
                error = str(exc)
                calls.append(self.db.log_call(kind=kind, provider=client.provider, model=client.model,
                                              status="rejected", error=error, input_tokens=reply.input_tokens,
                                              output_tokens=reply.output_tokens, cost_usd=cost,
                                              seconds=reply.seconds, prompt=prompt, reply=reply.text))
                continue
            calls.append(self.db.log_call(kind=kind, provider=client.provider, model=client.model, status="ok",
                                          input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                                          cost_usd=cost, seconds=reply.seconds, prompt=prompt, reply=reply.text))
            self.failures = 0
            return Proposal(code, ctx.parent.language, directive, ctx.parent, f"{kind} by {reply.model}",
                            tuple(calls))
        raise self._fail(f"no usable reply after {1 + self.cfg.patch_retries} tries: {error}")
