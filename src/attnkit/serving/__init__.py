"""``attnkit serve``: an HTTP API over a trained model, with dynamic batching and back-pressure, and a playground.

``models`` is the one adapter to attnkit's inference code, ``batcher`` the inference worker, its bounded queue and
the batching policy, ``schemas`` the request bodies (JSON, and LibreTranslate's form), ``http`` the JSON errors,
``auth`` the optional API key, ``gate`` the middleware in front of the app (API key, early 429, body limit,
headers), ``metrics`` the Prometheus metrics, ``app`` the FastAPI app (endpoints, limits, errors), ``server`` the
uvicorn server with deadlines for slow clients and a connection cap, ``static/`` the playground (plain HTML, JS
and CSS, no build step). Needs the ``serve`` extra (``pip install attnkit[serve]``).
"""
