-- Which receiver holds a running job's lease (its host name and listen port): a receiver that
-- restarts takes back its own interrupted attempts at once, instead of waiting for their leases
-- to expire as it must for another receiver's.
ALTER TABLE jobs ADD COLUMN leased_by text;
