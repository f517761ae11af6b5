"""The Kubernetes adapter: every call to the `kubernetes` client lives here.

A package of plain functions over a `CoreV1Api` / `BatchV1Api` that the caller passes in,
so tests hand in the in-memory fake (tests/fakes/fake_k8s.py) and nothing here
imports Django. Four jobs, one module each (`names` holds what they share):

1. **Inventory** — `inventory_from_nodes()` turns Node objects (GPU Feature
   Discovery labels, `status.allocatable`, taints, readiness, cordon) into
   `InventoryNode`s, minus what pods that Quartermaster did not create already
   hold on each node (Quartermaster's own attempts are counted by the
   database's allocations, so counting them here would count them twice).
2. **Launch** — `job_build()` makes an allowlisted `batch/v1` Job from a
   `LaunchSpec`; `job_create()` creates it and adopts an existing one on `409`. A gang
   is one JobSet where the cluster serves the CRD (`jobset.py`: `jobset_build()`,
   `jobset_create()`, `jobset_delete()`, `jobset_status()`), else one Job per pod.
3. **Stop** — `job_delete()` deletes with a grace period; a missing Job is fine.
4. **Status** — `classify()` turns a Job and its pods into an `Outcome`;
   `WorkloadWatcher` keeps Jobs and pods current with a watch that relists on
   `410 Gone`, plus a periodic resync.

Names are NVIDIA's and Kubernetes' own, verbatim (GPU Feature Discovery labels, device
plugin resources); failure signals are those of `status.py`.
"""
