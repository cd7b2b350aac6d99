"""The results folder: records, ledger, ownership, report files."""
