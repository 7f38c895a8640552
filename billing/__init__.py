"""Billing: chat.usage aggregated into a token ledger per user and org, per period."""
