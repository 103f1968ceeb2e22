"""Test doubles for management APIs that cannot run here (ONTAP, StorageGRID).

Each double is an HTTPS server on 127.0.0.1 (a throw-away CA signs its certificate) that
keeps the state the storage roles rely on and refuses what the appliance refuses:
ontap_rest.py checks every request against ONTAP's own REST schemas (ontap_schema.py,
from NetApp's `netapp-ontap` client) at the ONTAP release it claims; storagegrid_rest.py
enables the management API versions a grid of its release enables and takes only the
lifecycle elements StorageGRID documents. Both record every request (method, path,
query, body, auth) so tests can assert the exact sequence and payloads. They are not
simulators: what they model is listed in each module's docstring.
"""
