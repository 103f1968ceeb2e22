"""Test doubles for management APIs that cannot run here (ONTAP, StorageGRID).

Each double is a small HTTP server on 127.0.0.1 that keeps just enough state to
answer the calls the real netapp.ontap / netapp.storagegrid modules make, and
records every request (method, path, query, JSON body, auth) so tests can assert
the exact sequence and payloads. They are NOT simulators: they accept what the
modules send and model none of ONTAP's or StorageGRID's validation.
"""
