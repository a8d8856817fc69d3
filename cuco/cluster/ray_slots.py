"""Evaluation slots on a Ray cluster (search.backend = ray): each evaluation is a Ray task that asks for `world`
GPUs (or `world` CPUs for a CPU workload). A task's resources all come from one node, so its GPUs are NVLink peers
on one host, as a slot's are; the same code runs on a laptop (a Ray started here), inside a Slurm allocation
(`ray start` in the job script) and on Kubernetes (KubeRay). A node that dies mid-evaluation: Ray runs the task
again elsewhere (ray.retries), and if that fails too the evaluation is recorded as failed, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuco.cluster.node import Job, run_job, workload_files
from cuco.errors import CucoError
from cuco.evolve.slots import Slot
from cuco.extras import require
from cuco.runner.cascade import save_record
from cuco.runner.results.record import EvalRecord
from cuco.workload.spec import WorkloadSpec


def _task(job: Job) -> dict[str, Any]:
    """Runs on the node Ray chose: the GPU indices are those Ray made visible to the task (CUDA_VISIBLE_DEVICES).
    Ray sets OMP_NUM_THREADS to the task's CPU count; the ranks get the launcher's own default instead, so that a
    candidate is timed alike on either backend."""
    import os

    import ray

    os.environ.pop("OMP_NUM_THREADS", None)

    ctx = ray.get_runtime_context()
    gpus = list(range(job.world)) if job.device == "cuda" else []
    return run_job(job, gpus, {"node_id": ctx.get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()]})


@dataclass
class RayBackend:
    device: str  # cuda or cpu, for every evaluation of the run
    world: int
    retries: int

    @classmethod
    def connect(cls, address: str, device: str, world: int, retries: int) -> RayBackend:
        """Join (or, with no address, start) the cluster; device auto becomes cuda if some node holds `world`
        GPUs, else cpu."""
        ray = require("ray")
        try:
            ray.init(address=address or None, ignore_reinit_error=True, include_dashboard=False,
                     log_to_driver=False, logging_level="warning")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise CucoError("ray.address", f"cannot join the Ray cluster at {address or 'this machine'}: "
                                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        backend = cls(device, world, retries)
        if device == "auto":
            backend.device = "cuda" if backend.capacity("GPU") else "cpu"
        return backend

    def capacity(self, resource: str) -> int:
        """Evaluations the cluster's live nodes can hold at once: per node, its `resource` // world."""
        import ray

        return sum(int(n["Resources"].get(resource, 0)) // self.world for n in ray.nodes() if n["Alive"])

    def slots(self, requested: int) -> list[Slot]:
        resource = "GPU" if self.device == "cuda" else "CPU"
        n = self.capacity(resource)
        if n < 1:
            raise CucoError("search.slots", f"no node of the Ray cluster has {self.world} {resource}s for one "
                                            "evaluation")
        return [Slot(i, ()) for i in range(requested if requested > 0 else n)]

    def evaluator(self, cfg, shape: str):
        """The search's evaluator: a task per evaluation; its record comes back to the driver, where it is also
        written into the evaluation's directory of the run."""
        import ray

        resources = {"num_gpus": self.world, "num_cpus": 1} if self.device == "cuda" else {"num_cpus": self.world}
        task = ray.remote(max_retries=self.retries, **resources)(_task)

        files: dict[Path, dict[str, bytes]] = {}  # the workload's files, read once for the whole run

        def run(spec: WorkloadSpec, src: Path, slot: Slot, work: Path, name: str | None = None) -> EvalRecord:
            if spec.root not in files:
                files[spec.root] = workload_files(spec.root)
            job = Job(spec.name, spec.world_size, src.read_text(), src.suffix, shape, self.device, files[spec.root],
                      cfg.eval.timeout_s, cfg.eval.warmup, cfg.eval.iters, name)
            try:
                record = EvalRecord.from_dict(ray.get(task.remote(job)))
            except ray.exceptions.RayError as exc:  # the node died on every try, or the task could not run
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                record = EvalRecord(workload=spec.name, candidate=str(src), world=spec.world_size, device=self.device,
                                    failed_level="cluster", fault="runner",
                                    error=f"the cluster could not evaluate it: {type(exc).__name__}: {first}"[:500])
            save_record(record, work / "record.json")
            return record

        return run
