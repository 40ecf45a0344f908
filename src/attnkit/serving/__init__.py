"""``attnkit serve``: an HTTP API over a trained model, with dynamic batching and back-pressure, and a playground.

``models`` is the one adapter to attnkit's models, ``execute`` runs a batch of encoded inputs through one,
``batcher`` the inference worker, its bounded queue and the batching policy, ``worker`` the inference process,
``schemas`` the request bodies (JSON, and LibreTranslate's form), ``limits`` the limits and the checks of a request's
inputs, ``http`` the JSON errors, ``auth`` the optional API key, ``gate`` the middleware in front of the app (API
key, early 429, body limit, headers), ``metrics`` the Prometheus metrics, ``app`` the FastAPI app's wiring,
``routes`` its inference endpoints, ``probes`` its probes, /info and /metrics, ``server`` the uvicorn server with
deadlines for slow clients and a connection cap, ``static/`` the playground (plain HTML, JS and CSS, no build step).
Needs the ``serve`` extra (``pip install attnkit[serve]``).
"""
