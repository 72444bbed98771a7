"""General controller machinery, apart from trainwave's domain.

What client-go (tools/cache, util/workqueue, tools/leaderelection, tools/record)
and controller-runtime give a Go controller, cut down to what trainwave needs:

- informer.py   list, then watch, into a store; relist with jitter; a relist reports
                deletions as tombstones (reflector.go, delta_fifo.go, controller.go)
- namespaced.py one informer per watched namespace through namespaced endpoints
                (controller-runtime's multi_namespace_cache.go)
- index.py      records filed by owner, an indexer of one index (index.go)
- queue.py      the coalescing work queue and its per-item rate limiter with jitter
                (util/workqueue: queue.go, delaying_queue.go, default_rate_limiters.go)
- expectations.py  creations a controller waits to see in its cache
                (kubernetes pkg/controller/controller_utils.go, ControllerExpectations)
- recorder.py   Events posted in the background, spam-filtered (tools/record/event.go)
- leadership.py, leases.py  leader election on a Lease (tools/leaderelection)

This package imports nothing of trainwave but `trainwave.backoff` (stdlib only):
an import-linter contract in pyproject.toml holds it to that. Controllers import
it; it never imports them. What a job, a worker or a placement is, it does not know.
"""
