-- outbox_relay_leases: which host's relay publishes a broker's outbox rows
-- (package outbox, RelayLeaser; internal/relay).
--
-- Every host runs a relay. Without a lease they all claim the same rows:
-- claims stay correct (a row goes to one claim, a key's rows in order),
-- but each claim takes a third of the rows with three hosts, and the
-- claims and marks are three times the statements. With one, the holder
-- claims and the others only try to take the lease over now and then: it
-- lapses at expires_at unless its holder renews it, so a host that dies or
-- stops holding it stalls its broker's rows for at most the lease's length.
-- Nothing of a row's safety rests on it: two relays that both believe they
-- hold it claim as they did without it.
CREATE TABLE outbox_relay_leases (
  target_broker varchar(128) PRIMARY KEY,
  owner varchar(128) NOT NULL,
  expires_at timestamptz NOT NULL
);
