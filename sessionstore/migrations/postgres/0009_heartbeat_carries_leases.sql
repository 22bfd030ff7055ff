-- Session store schema, version 9 (PostgreSQL): leases ride on their Host's heartbeat.
--
-- A heartbeat used to rewrite every residency lease and registration of its Host (one row
-- each per beat: O(sessions) writes every few seconds). Now it writes only its own row here:
-- the generation it beat for, when, the expiry it gave, and when its unbroken run of beats
-- began (a beat after the previous one's expiry starts a new run). A lease of that Host and
-- generation reads as expiring at `beat_expires_at` when its own expiry reached into the
-- run (`expires_at > beat_since`), else at its own; a registration of that Host and
-- generation still in residence reads the beat's time and expiry. When a run ends (a new
-- generation beats, or a beat comes after the run's expiry), the heartbeat that ends it
-- first writes the run's expiry into the rows it carried, so nothing reads differently.
-- 0 means "no beat yet".
ALTER TABLE host_targets ADD COLUMN beat_generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE host_targets ADD COLUMN beat_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE host_targets ADD COLUMN beat_expires_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE host_targets ADD COLUMN beat_since BIGINT NOT NULL DEFAULT 0;
