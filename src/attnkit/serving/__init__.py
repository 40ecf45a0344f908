"""``attnkit serve``: an HTTP API over a trained model, with dynamic batching and back-pressure, and a playground.

``models`` is the one adapter to attnkit's inference code, ``batcher`` the inference worker, its bounded queue and
the batching policy, ``schemas`` the request bodies, ``http`` the JSON errors and the middleware (early 429, body
limit), ``metrics`` the Prometheus metrics, ``app`` the FastAPI app (endpoints, limits,
errors), ``static/`` the playground (plain HTML, JS and CSS, no build step). Needs the ``serve`` extra
(``pip install attnkit[serve]``).
"""
