-- +goose Up
-- A parked outbox row holds its key: the relay's claim skips every row whose
-- topic and key have an earlier parked row (rows without a key hold
-- nothing), until an operator retries the parked row (it is then published
-- first, the held rows after it, in id order) or discards it. The claim
-- probes this index once per candidate row; it holds parked rows only, so
-- it stays small, and the key is indexed by its SHA-256 because a btree
-- entry cannot hold a key of more than about 2.7 kB.
CREATE INDEX pgbox_outbox_parked_key_idx ON pgbox_outbox (topic, sha256(key), id)
    WHERE parked_at IS NOT NULL AND key IS NOT NULL;

-- failing_since: when the row's current run of publish failures began
-- (database clock). A row whose topic does not exist is retried for the
-- relay's UnknownTopicWindow from this time before it is parked.
ALTER TABLE pgbox_outbox ADD COLUMN failing_since timestamptz;

-- A relay instance registers before Kafka answers, so `relay status` shows it
-- running rather than "none running". kafka_ready is false until it has
-- reached Kafka since it started: such an instance takes no lanes (the
-- others keep them). kafka_down_since is when it last found Kafka
-- unreachable, NULL while Kafka answers. Rows of relays older than this
-- migration get kafka_ready = true, as before.
ALTER TABLE pgbox_relay_instances
    ADD COLUMN kafka_ready      boolean NOT NULL DEFAULT true,
    ADD COLUMN kafka_down_since timestamptz;

-- +goose Down
ALTER TABLE pgbox_relay_instances DROP COLUMN kafka_down_since, DROP COLUMN kafka_ready;
ALTER TABLE pgbox_outbox DROP COLUMN failing_since;
DROP INDEX pgbox_outbox_parked_key_idx;
