"""`thor serve`: the runtime as a long-lived local HTTP service (aiohttp).

config.py (TOML), jobs.py (the job queue: one generation worker and its bounded queue), host.py
(model load, warm-up, self-test; chat and plan jobs), openai_api.py / plan_api.py (request parsing
and response bodies), app.py (routes and middlewares), metrics.py, notify.py (sd_notify, watchdog).
"""
