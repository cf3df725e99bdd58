"""Starting chat turns through the API, with Django's TestCase (the example of
docs/testing.md, kept identical to it)."""

import json

from django.test import TestCase

from durable_django.testing import run_until_idle

from .models import Plan, Tenant


class StartTurnTests(TestCase):
    @classmethod
    def setUpTestData(cls):
        starter = Plan.objects.create(name="starter", max_active_turns=2)
        cls.acme = Tenant.objects.create(slug="acme", name="Acme", plan=starter)

    def setUp(self):
        self.auth = {"Authorization": f"Bearer {self.acme.issue_api_key()}"}

    def post_turn(self, message="hello there"):
        return self.client.post(
            "/tenants/acme/turns",
            json.dumps({"message": message}),
            content_type="application/json",
            headers=self.auth,
        )

    def test_a_turn_is_accepted_and_completes(self):
        response = self.post_turn()
        self.assertEqual(response.status_code, 202)
        run_id = response.json()["run_id"]

        self.assertEqual(run_until_idle(), 1)
        run = self.client.get(f"/runs/{run_id}", headers=self.auth).json()
        self.assertEqual(run["status"], "completed")

    def test_the_third_turn_of_a_starter_tenant_is_refused(self):
        for _ in range(2):
            self.assertEqual(self.post_turn().status_code, 202)

        refused = self.post_turn()

        self.assertEqual(refused.status_code, 429)
        self.assertEqual(refused.json()["key"], "tenant:acme")
        run_until_idle()  # the turns end and free their slots
        self.assertEqual(self.post_turn().status_code, 202)
