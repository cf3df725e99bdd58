"""Tenants, the plans that set how many chat turns each may have in progress, and the
messages the chat turns store."""

import hashlib
import secrets

from django.db import models


class Plan(models.Model):
    """A subscription plan: how many chat turns a tenant on it may have active at once."""

    name = models.CharField(max_length=50, unique=True)
    max_active_turns = models.PositiveIntegerField(
        help_text="Chat turns a tenant on this plan may have in progress at once."
    )

    class Meta:
        ordering = ["max_active_turns", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.max_active_turns} active turns)"


class Tenant(models.Model):
    """A customer company; its chat turns share one concurrency quota, ``tenant:<slug>``."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=100)
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="tenants")
    api_key_hash = models.CharField(
        max_length=64,
        blank=True,
        db_index=True,
        editable=False,
        help_text="SHA-256 of the tenant's API key; the key itself is shown once, when issued.",
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    @property
    def quota_key(self) -> str:
        return quota_key(self.slug)

    def issue_api_key(self) -> str:
        """A new API key for the tenant (the previous one stops working); only its hash
        is stored, so this is the one time it can be read."""
        key = secrets.token_urlsafe(32)
        self.api_key_hash = hash_api_key(key)
        self.save(update_fields=["api_key_hash"])
        return key


class Message(models.Model):
    """One chat turn's exchange: what the user said and the reply, stored by the workflow."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="messages")
    run_id = models.CharField(max_length=255, unique=True)
    prompt = models.TextField()
    reply = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.prompt[:40]}"


QUOTA_KEY_PREFIX = "tenant:"


def quota_key(slug: str) -> str:
    """The concurrency key a tenant's chat turns are started under."""
    return f"{QUOTA_KEY_PREFIX}{slug}"


def hash_api_key(key: str) -> str:
    """What is stored of an API key: a random key needs no salt or slow hash."""
    return hashlib.sha256(key.encode()).hexdigest()
