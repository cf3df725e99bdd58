"""The chat API, through Django's test client: ``python manage.py test --settings
chatsite.test_settings``. Runs are executed in the test process with ``run_until_idle``."""

from __future__ import annotations

import json

from django.test import TestCase

from durable_django import engine
from durable_django.testing import run_until_idle

from .models import Plan, Tenant


class ChatApiTestCase(TestCase):
    @classmethod
    def setUpTestData(cls) -> None:
        starter = Plan.objects.create(name="starter", max_active_turns=2)
        cls.acme = Tenant.objects.create(slug="acme", name="Acme", plan=starter)
        cls.globex = Tenant.objects.create(slug="globex", name="Globex", plan=starter)

    def setUp(self) -> None:
        self.keys = {t.slug: t.issue_api_key() for t in (self.acme, self.globex)}

    def auth(self, slug: str = "acme") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[slug]}"}

    def post_turn(
        self, body: object = None, *, slug: str = "acme", raw: bytes | None = None, **headers: str
    ):
        data = raw if raw is not None else json.dumps(body or {"message": "hello there"})
        return self.client.post(
            f"/tenants/{slug}/turns",
            data,
            content_type="application/json",
            headers={**self.auth(slug), **headers},
        )


class AuthenticationTests(ChatApiTestCase):
    def test_a_request_without_the_tenants_key_is_refused(self) -> None:
        anonymous = self.client.post(
            "/tenants/acme/turns", {"message": "hi"}, content_type="application/json"
        )
        self.assertEqual(anonymous.status_code, 401)
        self.assertIn("Bearer", anonymous["WWW-Authenticate"])
        wrong_key = self.client.post(
            "/tenants/acme/turns",
            {"message": "hi"},
            content_type="application/json",
            headers=self.auth("globex"),
        )
        self.assertEqual(wrong_key.status_code, 403)
        self.assertEqual(engine.count_runs(), 0)


class IdempotencyKeyTests(ChatApiTestCase):
    def test_a_retried_request_answers_the_same_run(self) -> None:
        first = self.post_turn({"message": "hi"}, **{"Idempotency-Key": "req-1"})
        again = self.post_turn({"message": "hi"}, **{"Idempotency-Key": "req-1"})

        self.assertEqual((first.status_code, again.status_code), (202, 202))
        self.assertEqual(first.json()["run_id"], again.json()["run_id"])
        self.assertEqual((first.json()["created"], again.json()["created"]), (True, False))
        self.assertEqual(engine.count_runs(), 1)

        run_until_idle()
        after = self.post_turn({"message": "hi"}, **{"Idempotency-Key": "req-1"})
        self.assertEqual(after.json()["status"], "completed")
        self.assertEqual(engine.count_runs(), 1)

    def test_a_retry_is_never_refused_by_a_full_quota(self) -> None:
        first = self.post_turn(**{"Idempotency-Key": "a"})
        self.post_turn(**{"Idempotency-Key": "b"})
        self.assertEqual(self.post_turn(**{"Idempotency-Key": "c"}).status_code, 429)
        again = self.post_turn(**{"Idempotency-Key": "a"})
        self.assertEqual((again.status_code, again.json()["run_id"]), (202, first.json()["run_id"]))

    def test_keys_are_scoped_to_the_tenant(self) -> None:
        acme = self.post_turn(**{"Idempotency-Key": "same"})
        globex = self.post_turn(slug="globex", **{"Idempotency-Key": "same"})
        self.assertNotEqual(acme.json()["run_id"], globex.json()["run_id"])
        self.assertTrue(globex.json()["created"])

    def test_a_key_reused_for_another_request_is_refused(self) -> None:
        self.post_turn({"message": "one"}, **{"Idempotency-Key": "k"})
        reused = self.post_turn({"message": "two"}, **{"Idempotency-Key": "k"})
        self.assertEqual(reused.status_code, 422)

    def test_a_malformed_key_is_a_400(self) -> None:
        for key in ("", "x" * 65, "has space", "ünï", "a/b"):
            with self.subTest(key=key):
                response = self.post_turn(**{"Idempotency-Key": key})
                self.assertEqual(response.status_code, 400)
                self.assertIn("Idempotency-Key", response.json()["message"])
        self.assertEqual(engine.count_runs(), 0)


class BadBodyTests(ChatApiTestCase):
    def assert_400(self, response, words: str) -> None:
        self.assertEqual(response.status_code, 400, response.content)
        self.assertIn(words, response.json()["message"])

    def test_bodies_that_are_not_a_chat_message(self) -> None:
        self.assert_400(self.post_turn(raw=b"not json"), "must be JSON")
        self.assert_400(self.post_turn(raw=b"\xff\xfe"), "must be JSON")
        self.assert_400(self.post_turn({"message": "  "}), "non-empty")
        self.assert_400(self.post_turn({"message": "x" * 4001}), "longer than")
        self.assertEqual(engine.count_runs(), 0)

    def test_a_nul_character(self) -> None:
        self.assert_400(self.post_turn(raw=b'{"message": "a\\u0000b"}'), "NUL")

    def test_a_lone_surrogate(self) -> None:
        self.assert_400(self.post_turn(raw=b'{"message": "a\\ud800b"}'), "surrogate")

    def test_absurd_nesting(self) -> None:
        deep = b'{"message": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        self.assert_400(self.post_turn(raw=deep), "must be JSON")
        self.assertEqual(engine.count_runs(), 0)


class RunDetailTests(ChatApiTestCase):
    def test_a_tenant_sees_only_its_own_runs(self) -> None:
        run_id = self.post_turn().json()["run_id"]
        own = self.client.get(f"/runs/{run_id}", headers=self.auth())
        self.assertEqual((own.status_code, own.json()["status"]), (200, "pending"))
        self.assertEqual(own["Retry-After"], "1")
        self.assertEqual(
            self.client.get(f"/runs/{run_id}", headers=self.auth("globex")).status_code, 404
        )
        self.assertEqual(self.client.get(f"/runs/{run_id}").status_code, 404)

    def test_tenant_usage(self) -> None:
        self.post_turn()
        detail = self.client.get("/tenants/acme", headers=self.auth()).json()
        self.assertEqual((detail["active_turns"], detail["max_active_turns"]), (1, 2))
        self.assertEqual(self.client.get("/tenants/acme").status_code, 401)
