-- +goose Up
-- A relay instance that has found no rows for a while sets sleeping and then
-- waits for a notification. Writers with outbox.Config.Notify send pg_notify
-- only while some live instance is sleeping: a NOTIFY serializes the commits
-- of every notifying transaction in the cluster, so under steady traffic,
-- when the relays are awake and watching the table themselves, writers pay
-- nothing for the wake-up.
ALTER TABLE pgbox_relay_instances ADD COLUMN sleeping boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE pgbox_relay_instances DROP COLUMN sleeping;
