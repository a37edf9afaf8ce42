"""sync ITER: rsync checkpoints/ITER to every inference target, verify, publish atomically, write a receipt."""

from pathlib import Path

from burstrl.policy import read_metadata
from burstrl.stage import parse, stage, write_json
from burstrl.sync import sync_checkpoint

if __name__ == "__main__":
    args, cfg = parse(__doc__, "iteration")
    metrics: dict = {}
    with stage("sync", metrics):
        src = Path("checkpoints") / args.iteration
        meta = read_metadata(src)
        targets = [sync_checkpoint(src, args.iteration, meta["content_hash"], spec, cfg.sync.ssh_command)
                   for spec in cfg.sync.targets]
    write_json(Path(f"data/sync/{args.iteration}.json"), {
        "policy_version": meta["policy_version"],
        "content_hash": meta["content_hash"],
        "targets": targets,
        "seconds": metrics["seconds"],
    })
    print(f"sync {args.iteration}: published to {', '.join(t['path'] for t in targets)} in {metrics['seconds']}s")
