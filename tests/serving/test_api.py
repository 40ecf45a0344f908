"""Every endpoint in-process (FastAPI's TestClient): shapes, values, and that each answer is what the library
computes for the same input."""

from __future__ import annotations

import base64
import struct

import pytest
import torch

from attnkit.serving.app import create_app
from attnkit.serving.models import load_model


def test_health_ready_info(classifier_client):
    assert classifier_client.get("/health").json() == {"status": "ok"}
    assert classifier_client.get("/ready").json() == {"status": "ready"}
    info = classifier_client.get("/info").json()
    assert info["task"] == "classifier" and info["labels"] == ["negative", "positive"]
    assert (info["n_layers"], info["n_heads"], info["max_len"]) == (2, 2, 32)
    assert info["limits"]["max_inputs"] == 64 and info["limits"]["attention_max_tokens"] == 32
    assert info["inference"] == {"precision": "fp32", "device": "cpu", "worker": "thread"}


def test_ready_is_503_until_the_model_has_loaded(classifier_dir):
    import threading

    gate = threading.Event()

    def slow_loader():
        gate.wait(10)
        return load_model(classifier_dir)

    from fastapi.testclient import TestClient

    with TestClient(create_app(slow_loader)) as client:
        response = client.get("/ready")
        assert response.status_code == 503 and response.json()["error_type"] == "not_ready"
        assert client.post("/v1/classify", json={"inputs": "good"}).status_code == 503
        assert client.get("/health").status_code == 200  # alive while loading
        gate.set()
        for _ in range(100):
            if client.get("/ready").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert client.get("/ready").status_code == 200


def test_classify_probabilities_are_the_models(classifier_client, classifier_dir):
    from attnkit.tasks.classify import ClassifierRun

    texts = ["a truly wonderful film", "boring and bad", "zzqx unknown words"]
    results = classifier_client.post("/v1/classify", json={"inputs": texts}).json()["results"]
    expected = ClassifierRun(classifier_dir).predict(texts)
    for got, want in zip(results, expected):
        assert got["text"] == want.text and got["label"] == want.label
        assert got["probs"] == pytest.approx(want.probs, abs=1e-6)
        assert sum(got["probs"].values()) == pytest.approx(1.0, abs=1e-6)
    assert results[2]["tokens"][0] == "<unk>"  # unknown words are shown as <unk>
    single = classifier_client.post("/v1/classify", json={"inputs": texts[0]}).json()["results"]
    assert len(single) == 1 and single[0]["probs"] == pytest.approx(results[0]["probs"], abs=1e-6)


def test_truncate_cuts_an_over_long_text_to_max_len(classifier_client):
    long = " ".join(["good"] * 50)
    refused = classifier_client.post("/v1/classify", json={"inputs": long})
    assert (
        refused.status_code == 422 and "50 tokens" in refused.json()["error"] and "truncate" in refused.json()["error"]
    )
    cut = classifier_client.post("/v1/classify", json={"inputs": long, "truncate": True}).json()["results"][0]
    assert cut["truncated"] and len(cut["tokens"]) == 32
    short = classifier_client.post("/v1/classify", json={"inputs": " ".join(["good"] * 32)}).json()["results"][0]
    assert cut["probs"] == pytest.approx(short["probs"], abs=1e-6)


def test_embed_equals_attnkit_embed(classifier_client, classifier_dir):
    from attnkit.interop.bert import embed

    texts = ["a truly wonderful film", "bad"]
    for normalize in (False, True):
        got = classifier_client.post("/v1/embed", json={"inputs": texts, "pool": "mean", "normalize": normalize})
        want = embed(classifier_dir, texts, pool="mean", normalize=normalize)
        assert got.json()["dim"] == 16
        torch.testing.assert_close(torch.tensor(got.json()["vectors"]), want, atol=1e-6, rtol=0)
    # A word tokenizer prepends no [CLS]: "cls" pooling is refused, as `attnkit embed --pool cls` refuses it (both
    # took the first word's vector).
    refused = classifier_client.post("/v1/embed", json={"inputs": texts, "pool": "cls"})
    assert refused.status_code == 422 and "[CLS] token" in refused.json()["error"]


def test_openai_embeddings_shape_float_and_base64(classifier_client, classifier_dir):
    from attnkit.interop.bert import embed

    want = embed(classifier_dir, ["good film", "bad"], normalize=True)
    body = classifier_client.post("/v1/embeddings", json={"input": ["good film", "bad"], "model": "x"}).json()
    assert body["object"] == "list" and body["model"] == "x" and body["usage"]["prompt_tokens"] == 3
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    torch.testing.assert_close(torch.tensor([d["embedding"] for d in body["data"]]), want, atol=1e-6, rtol=0)
    b64 = classifier_client.post("/v1/embeddings", json={"input": "bad", "encoding_format": "base64"}).json()
    decoded = struct.unpack("<16f", base64.b64decode(b64["data"][0]["embedding"]))
    torch.testing.assert_close(torch.tensor(decoded), want[1], atol=1e-6, rtol=0)


def test_classifier_attention_maps(classifier_client):
    body = classifier_client.post("/v1/attention", json={"inputs": "a wonderful zzqx"}).json()
    maps = torch.tensor(body["encoder_self"])
    assert maps.shape == (2, 2, 3, 3)  # [layer][head][query][key]
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 3))  # each row is a distribution over the keys
    assert body["tokens"] == ["a", "wonderful", "<unk>"]


def test_attention_input_is_capped(classifier_dir, serve_client):
    with serve_client(classifier_dir, attention_max_tokens=4) as client:
        refused = client.post("/v1/attention", json={"inputs": "one two three four five"})
        assert refused.status_code == 422 and "5 tokens; the limit is 4" in refused.json()["error"]
        assert client.post("/v1/attention", json={"inputs": "one two three four"}).status_code == 200


def test_translate_nbest_scores(translator_client):
    body = translator_client.post("/v1/translate", json={"inputs": ["a b c", "d e"], "beam": 4, "n_best": 3}).json()
    for result in body["results"]:
        nbest = result["n_best"]
        assert len(nbest) == 3 and result["translation"] == nbest[0]["translation"]
        normalized = [c["normalized_score"] for c in nbest]
        assert normalized == sorted(normalized, reverse=True)  # ranked by the length-penalised score
        for c in nbest:  # gnmt lp >= 1 for any length: the normalised score is the raw one divided by it
            assert c["score"] <= 0 and c["normalized_score"] >= c["score"]


def test_translator_attention_has_three_kinds(translator_client):
    body = translator_client.post("/v1/attention", json={"inputs": "a b c"}).json()
    enc, dec, cross = (torch.tensor(body[k]) for k in ("encoder_self", "decoder_self", "cross"))
    n_out = len(body["output_tokens"])
    assert enc.shape == (2, 2, 4, 4)  # 3 words + </s>
    assert dec.shape == (2, 2, n_out, n_out) and cross.shape == (2, 2, n_out, 4)
    assert torch.triu(dec[0, 0], diagonal=1).abs().max() == 0  # causal


def test_attention_names_the_end_token_as_the_vocabulary_does(translator_client):
    """The source's EOS and the output's are one token; they are named alike (`<eos>`, never `</s>` in one list)."""
    body = translator_client.post("/v1/attention", json={"inputs": "c d e"}).json()  # stops at EOS (seed 0 weights)
    assert body["tokens"][-1] == body["output_tokens"][-1] == "<eos>"
    assert "</s>" not in body["tokens"] + body["output_tokens"] + body["input_tokens_decoder"]


def test_libretranslate_shape(translator_client):
    ours = translator_client.post("/v1/translate", json={"inputs": ["a b c", "d e"], "beam": 4, "n_best": 3}).json()
    one = translator_client.post("/translate", json={"q": "a b c", "source": "en", "target": "de"}).json()
    assert one == {"translatedText": ours["results"][0]["translation"]}
    many = translator_client.post("/translate", json={"q": ["a b c", "d e"], "alternatives": 2, "api_key": ""}).json()
    assert many["translatedText"] == [r["translation"] for r in ours["results"]]
    assert many["alternatives"] == [[c["translation"] for c in r["n_best"][1:]] for r in ours["results"]]


def test_endpoint_of_another_task_is_a_400(classifier_client, translator_client):
    wrong = classifier_client.post("/v1/translate", json={"inputs": "a"})
    assert wrong.status_code == 400 and wrong.json()["error_type"] == "wrong_model"
    assert translator_client.post("/v1/classify", json={"inputs": "a"}).status_code == 400


def test_metrics_count_requests_and_batches(classifier_client):
    classifier_client.post("/v1/classify", json={"inputs": "good"})
    classifier_client.post("/v1/classify", json={"inputs": 5})
    text = classifier_client.get("/metrics").text
    assert 'attnkit_requests_total{endpoint="/v1/classify",status="200"}' in text
    assert 'attnkit_requests_total{endpoint="/v1/classify",status="422"}' in text
    for name in (
        "attnkit_queue_size",
        "attnkit_queue_seconds_bucket",
        "attnkit_inference_seconds_bucket",
        "attnkit_request_seconds_bucket",
        "attnkit_batch_requests_bucket",
        "attnkit_batch_padded_tokens_bucket",
    ):
        assert name in text


def test_openapi_and_playground(classifier_client):
    schema = classifier_client.get("/openapi.json").json()
    for path in ("/v1/classify", "/v1/embed", "/v1/embeddings", "/v1/translate", "/translate", "/v1/attention"):
        assert "post" in schema["paths"][path]
    page = classifier_client.get("/")
    assert page.status_code == 200 and "attnkit playground" in page.text
    for asset in ("/static/app.js", "/static/style.css"):
        assert classifier_client.get(asset).status_code == 200
    assert "http" not in page.text.replace("http-equiv", "")  # no CDN: everything comes from this server


def test_every_operation_of_the_openapi_description_has_an_id_of_its_own(classifier_client):
    """OpenAPI requires operationIds unique across the description (client generators name methods after them):
    every route has one method (HEAD is answered wherever GET is, outside the routes: test_http.py)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns "Duplicate Operation ID" while it builds the description
        paths = classifier_client.get("/openapi.json").json()["paths"]
    ids = [operation["operationId"] for path in paths.values() for operation in path.values()]
    assert len(ids) == len(set(ids)), ids
    for probe in ("/health", "/ready"):
        assert set(paths[probe]) == {"get"}
        assert classifier_client.head(probe).status_code == 200


def test_the_openapi_description_states_this_servers_beam_limit(translator_dir):
    """The beam, n_best and alternatives a client may send are bounded by the server's --max-beam, and the
    description says so, for the JSON bodies and the form (it said 16, the largest any server allows)."""
    from fastapi.testclient import TestClient

    from attnkit.serving.app import create_app
    from attnkit.serving.limits import Limits
    from attnkit.serving.models import load_model

    app = create_app(load_model(translator_dir), Limits(max_beam=3))
    schema = TestClient(app).get("/openapi.json").json()
    translate = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert translate["beam"]["maximum"] == translate["n_best"]["maximum"] == 3
    assert schema["components"]["schemas"]["LibreTranslateRequest"]["properties"]["alternatives"]["maximum"] == 2
    form = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/x-www-form-urlencoded"]
    assert form["schema"]["properties"]["alternatives"]["maximum"] == 2


def test_the_playground_is_sent_with_a_content_security_policy(classifier_client):
    """Its page may run this server's script and style files and call this server, nothing else (the browser test
    in test_live.py runs it under this policy); every answer forbids MIME sniffing."""
    for path in ("/", "/static/index.html", "/static/app.js", "/static/style.css"):
        headers = classifier_client.get(path).headers
        policy = dict(part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";"))
        assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
        assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'"
        assert headers["x-content-type-options"] == "nosniff"
    for path in ("/health", "/info", "/v2/nothing"):
        assert classifier_client.get(path).headers["x-content-type-options"] == "nosniff"


def test_minilm_server_embeddings_equal_attnkit_embed(serve_client):
    from attnkit.data.packages import default_cache_dir
    from attnkit.interop.bert import embed

    if not (default_cache_dir() / "minilm" / "model.safetensors").is_file():
        pytest.skip("MiniLM is not cached (run `attnkit data fetch minilm` once; tests never download)")
    texts = ["The new movie is awesome", "A cat sat on the mat."]
    with serve_client("minilm") as client:
        info = client.get("/info").json()
        assert info["task"] == "embedder" and (info["n_layers"], info["n_heads"]) == (6, 12)
        body = client.post("/v1/embeddings", json={"input": texts}).json()
        maps = client.post("/v1/attention", json={"inputs": "an unseen zzqxw word"}).json()
        wrong = client.post("/v1/classify", json={"inputs": "a"})
        assert (wrong.status_code, wrong.json()["error"]) == (
            400,
            "this endpoint needs a classifier; the server runs an embedder",
        )
    want = embed("minilm", texts, normalize=True)
    torch.testing.assert_close(torch.tensor([d["embedding"] for d in body["data"]]), want, atol=1e-6, rtol=0)
    assert torch.tensor(maps["encoder_self"]).shape[:2] == (6, 12) and maps["tokens"][0] == "[CLS]"


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/classify", {"inputs": ["a good film", "a dull, lifeless film"], "truncate": True}),
        ("/v1/classify", {"inputs": "good"}),
        ("/v1/embed", {"inputs": "a good film", "pool": "cls"}),
        ("/v1/embeddings", {"input": ["a good film"], "encoding_format": "base64"}),
        ("/v1/attention", {"inputs": "a good film"}),
        ("/v1/classify", {"inputs": "x" * 20_000}),  # an ApiError from the handler (422: too long)
        ("/v1/translate", {"inputs": "good"}),  # an ApiError of another kind (400: wrong model)
    ],
)
def test_the_direct_path_answers_as_fastapi_does(classifier_client, path, body):
    """Gate answers schema-valid application/json bodies itself; the same body as application/vnd.api+json goes
    through FastAPI (which parses +json types too): status, headers that matter and bodies must be the same."""
    import json

    raw = json.dumps(body)
    direct = classifier_client.post(path, content=raw, headers={"Content-Type": "application/json"})
    routed = classifier_client.post(path, content=raw, headers={"Content-Type": "application/vnd.api+json"})
    assert direct.status_code == routed.status_code
    assert direct.headers["content-type"] == routed.headers["content-type"]
    assert direct.json() == routed.json()


def test_with_the_compiled_engine_a_new_bucket_is_answered_while_its_programs_compile(
    monkeypatch, translator_dir, translator_client, serve_client
):
    """``ATTNKIT_ENGINE=compiled``: the warm-up waits for the programs of one sentence; a request of another bucket
    (two sentences, beam 4) is answered by the eager step, within a timeout shorter than its compilation, with the
    default server's translations (and scores, to rounding), while its programs are made in the compiler's thread.
    The compiler is a stand-in that takes 2.5 s for each program of that bucket (real compilation:
    ``tests/decoding/test_engines.py``)."""
    import threading
    import time

    from attnkit.inference import background, programs

    slow = threading.Event()

    def stand_in(fn, device):
        def program(*args):
            if slow.is_set():  # from here on only the new bucket's programs run: each first run compiles
                time.sleep(2.5)
            return fn(*args)

        return program

    compiler = background.Compiler()
    monkeypatch.setattr(background, "COMPILER", compiler)
    monkeypatch.setattr(programs, "_compiled", stand_in)
    monkeypatch.setattr(programs, "_SEEN", {})
    monkeypatch.setenv(programs.ENV, "compiled")
    body = {"inputs": ["a b c", "d e"], "beam": 4, "n_best": 2}
    expected = translator_client.post("/v1/translate", json=body).json()  # the default (eager) server's
    with serve_client(translator_dir, timeout_s=1.5) as client:
        assert client.get("/info").json()["inference"]["engine"] == "compiled"
        assert compiler.known and compiler.wait(0)  # the warm-up's programs, made before it was ready
        slow.set()
        started = time.monotonic()
        answer = client.post("/v1/translate", json=body)
        assert answer.status_code == 200, answer.text
        assert time.monotonic() - started < 1.5 and not compiler.wait(0)  # answered; still compiling
        got = answer.json()["results"]
        assert [[c["translation"] for c in r["n_best"]] for r in got] == [
            [c["translation"] for c in r["n_best"]] for r in expected["results"]
        ]
        scores = [c["score"] for r in got for c in r["n_best"]]  # the bucket's padded shapes round differently
        assert scores == pytest.approx([c["score"] for r in expected["results"] for c in r["n_best"]], rel=1e-4)
        assert compiler.wait(60) and not compiler.failed
