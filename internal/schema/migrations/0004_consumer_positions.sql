-- The table of consumer positions (package position): one row per
-- (consumer group, unit). A unit is what one owner holds at a time: a
-- partition ("order:c-1"), a process manager's correlation value
-- ("fulfillment:o-1") or an event-store subscription ("order", "$all").
--
-- generation is the owner's fencing generation, bumped by every claim; an
-- effect transaction commits only while the row still holds its owner's
-- generation. positions maps each source stream the unit reads to the
-- event-store global position of the last message whose effects committed,
-- {"order:c-1": 42, "order:c-1:backfill": 17}; it only moves forward,
-- except by an operator's hand.

CREATE TABLE consumer_positions (
  consumer_group text NOT NULL,
  unit text NOT NULL,
  generation bigint NOT NULL CHECK (generation >= 0),
  positions jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(positions) = 'object'),
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (consumer_group, unit)
);
