//! The row primitives of a store operation ([`Tx`]) in SQL, written once for both backends:
//! every statement an operation runs, on the mapping `sql` provides. On PostgreSQL the command
//! lifecycle's writes go to the merged statements of `merged` instead; on SQLite they read with
//! plain statements and leave the write to the operation. Never decides an outcome (the
//! operations in `ops` do) and never opens or commits a transaction.

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;
use crate::journal::*;
use crate::merged;
use crate::model::*;
use crate::ops::{
    Admitted, Appended, CursorRead, Found, JournalRow, SettleRead, TransitionKind, Transitioning,
    Tx,
};
use crate::sql::*;

impl<C: Conn> SqlTx<C> {
    async fn session_exists(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<bool> {
        let rows = self
            .rows(
                "SELECT 1 FROM sessions WHERE tenant_id = $1 AND session_id = $2",
                ts(t, s),
                "session",
            )
            .await?;
        Ok(!rows.is_empty())
    }
}

fn ts(t: &TenantId, s: &SessionId) -> Vec<Param> {
    vec![text(t.as_str()), text(s.as_str())]
}

impl<C: Conn> Tx for SqlTx<C> {
    async fn session(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<Option<SessionRecord>> {
        let q = format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE tenant_id = $1 AND session_id = $2 FOR_UPDATE"
        );
        self.one(&q, ts(t, s), "session", decode_session).await
    }

    async fn insert_session(&mut self, rec: &SessionRecord, next_order: u64) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO sessions ({SESSION_COLS}, next_order) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)"
        );
        self.exec(
            &q,
            vec![
                text(rec.tenant.as_str()),
                text(rec.session.as_str()),
                text(rec.agent.as_str()),
                text(rec.compatibility.as_str()),
                text(rec.binding.runtime_session_id.to_text()),
                text(rec.binding.storage_binding_id.as_str()),
                int(rec.binding.binding_version),
                ms(rec.created_at_ms),
                ms(rec.last_active_ms),
                text(rec.residency_state.as_str()),
                int(rec.last_journal_seq),
                int(rec.checkpoint_seq),
                int(rec.gate_mark.0),
                int(next_order),
            ],
        )
        .await?;
        Ok(())
    }

    async fn update_session(&mut self, rec: &SessionRecord) -> StoreResult<()> {
        self.exec(
            "UPDATE sessions SET last_active_at = $3, residency_state = $4, last_journal_seq = $5, \
             checkpoint_seq = $6, gate_mark = $7 WHERE tenant_id = $1 AND session_id = $2",
            vec![
                text(rec.tenant.as_str()),
                text(rec.session.as_str()),
                ms(rec.last_active_ms),
                text(rec.residency_state.as_str()),
                int(rec.last_journal_seq),
                int(rec.checkpoint_seq),
                int(rec.gate_mark.0),
            ],
        )
        .await?;
        Ok(())
    }

    async fn take_order(&mut self, t: &TenantId, s: &SessionId, now: Millis) -> StoreResult<u64> {
        let mut p = ts(t, s);
        p.push(ms(now));
        let rows = self
            .rows(
                "UPDATE sessions SET next_order = next_order + 1, last_active_at = $3 \
                 WHERE tenant_id = $1 AND session_id = $2 RETURNING next_order - 1",
                p,
                "session",
            )
            .await?;
        rows.first()
            .ok_or_else(|| StoreError::not_found("session", format!("{t}/{s}")))?
            .u64(0)
    }

    async fn list_sessions(
        &mut self,
        t: &TenantId,
        after: Option<&SessionId>,
        limit: usize,
    ) -> StoreResult<Vec<SessionRecord>> {
        let q = format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE tenant_id = $1 AND session_id > $2 ORDER BY session_id LIMIT {limit}"
        );
        self.many(
            &q,
            vec![text(t.as_str()), text(after.map_or("", |a| a.as_str()))],
            "session",
            decode_session,
        )
        .await
    }

    async fn lease(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<Option<ResidencyLease>> {
        let q = format!(
            "SELECT {} FROM residency_leases l WHERE l.tenant_id = $1 AND l.session_id = $2 FOR_UPDATE",
            LEASE_READ.as_str()
        );
        self.one(&q, ts(t, s), "residency_lease", decode_lease)
            .await
    }

    async fn put_lease(&mut self, l: &ResidencyLease) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO residency_leases ({LEASE_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7) \
             ON CONFLICT (tenant_id, session_id) DO UPDATE SET epoch = excluded.epoch, \
             holder = excluded.holder, host_id = excluded.host_id, \
             host_generation = excluded.host_generation, expires_at = excluded.expires_at"
        );
        self.exec(
            &q,
            vec![
                text(l.tenant.as_str()),
                text(l.session.as_str()),
                int(l.epoch.0),
                opt_text(l.holder.clone()),
                opt_text(l.host.as_ref().map(|h| h.as_str().to_owned())),
                opt_int(l.host_generation),
                opt_ms(l.expires_at_ms),
            ],
        )
        .await?;
        Ok(())
    }

    async fn registration(
        &mut self,
        t: &TenantId,
        s: &SessionId,
    ) -> StoreResult<Option<HostRegistration>> {
        let q = format!(
            "SELECT {} FROM host_registrations r WHERE r.tenant_id = $1 AND r.session_id = $2 FOR_UPDATE",
            REG_READ.as_str()
        );
        self.one(&q, ts(t, s), "host_registration", decode_registration)
            .await
    }

    async fn put_registration(&mut self, r: &HostRegistration) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO host_registrations ({REG_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) \
             ON CONFLICT (tenant_id, session_id) DO UPDATE SET host_id = excluded.host_id, \
             host_generation = excluded.host_generation, endpoint = excluded.endpoint, \
             residency = excluded.residency, accepting = excluded.accepting, \
             lease_epoch = excluded.lease_epoch, observed_at = excluded.observed_at, \
             expires_at = excluded.expires_at"
        );
        self.exec(
            &q,
            vec![
                text(r.tenant.as_str()),
                text(r.session.as_str()),
                text(r.host.as_str()),
                int(r.host_generation),
                text(r.endpoint.clone()),
                text(r.residency.as_str()),
                flag(r.accepting),
                int(r.lease_epoch.0),
                ms(r.observed_at_ms),
                ms(r.expires_at_ms),
            ],
        )
        .await?;
        Ok(())
    }

    async fn target(&mut self, host: &HostId) -> StoreResult<Option<HostTarget>> {
        let q = format!("SELECT {TARGET_COLS} FROM host_targets WHERE host_id = $1 FOR_UPDATE");
        self.one(&q, vec![text(host.as_str())], "host_target", decode_target)
            .await
    }

    async fn put_target(&mut self, h: &HostTarget) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO host_targets ({TARGET_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) \
             ON CONFLICT (host_id) DO UPDATE SET endpoint = excluded.endpoint, \
             placement = excluded.placement, isolation_class = excluded.isolation_class, \
             capacity = excluded.capacity, accepting = excluded.accepting, \
             generation = excluded.generation, observed_at = excluded.observed_at, \
             expires_at = excluded.expires_at, weight_used = excluded.weight_used"
        );
        self.exec(
            &q,
            vec![
                text(h.host.as_str()),
                text(h.endpoint.clone()),
                text(h.placement.as_str()),
                text(h.isolation_class.clone()),
                int(u64::from(h.capacity)),
                flag(h.accepting),
                int(h.generation),
                ms(h.observed_at_ms),
                ms(h.expires_at_ms),
                int(u64::from(h.weight_used)),
            ],
        )
        .await?;
        Ok(())
    }

    async fn targets(&mut self) -> StoreResult<Vec<HostTarget>> {
        let q = format!("SELECT {TARGET_COLS} FROM host_targets ORDER BY host_id");
        self.many(&q, vec![], "host_target", decode_target).await
    }

    async fn command(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        c: &CommandId,
    ) -> StoreResult<Option<CommandRecord>> {
        let mut p = ts(t, s);
        p.push(text(c.as_str()));
        self.one(&COMMAND_BY_ID, p, "command", decode_command).await
    }

    async fn command_by_runtime_id(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<Option<CommandRecord>> {
        let q = format!(
            "SELECT {COMMAND_COLS} FROM commands WHERE tenant_id = $1 AND session_id = $2 AND runtime_command_id = $3"
        );
        let mut p = ts(t, s);
        p.push(text(rc.to_text()));
        self.one(&q, p, "command", decode_command).await
    }

    async fn insert_command(&mut self, rec: &CommandRecord) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO commands ({COMMAND_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,\
             $15,$16,$17,$18,$19,$20,$21,$22,$23,$24,$25,$26,$27,$28,$29,$30)"
        );
        self.exec(&q, command_params(rec)).await?;
        Ok(())
    }

    async fn update_command(
        &mut self,
        old_revision: u64,
        rec: &CommandRecord,
    ) -> StoreResult<bool> {
        // Identity columns never change; only the state-machine columns (16..30) are written.
        let all = command_params(rec);
        let mut p: Vec<Param> = all[..3].to_vec();
        p.extend_from_slice(&all[16..30]);
        p.push(int(old_revision));
        let n = self
            .exec(
                "UPDATE commands SET state = $4, revision = $5, epoch_mark = $6, claim_epoch = $7, \
                 claim_token = $8, claim_expires_at = $9, attempt_id = $10, \
                 attempt_journal_epoch = $11, attempt_residency_epoch = $12, attempt_at = $13, \
                 outcome = $14, reason = $15, evidence_seq = $16, settled_at = $17 \
                 WHERE tenant_id = $1 AND session_id = $2 AND command_id = $3 AND revision = $18",
                p,
            )
            .await?;
        Ok(n == 1)
    }

    async fn commands_after(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        after_order: u64,
        limit: usize,
    ) -> StoreResult<Vec<CommandRecord>> {
        let q = format!(
            // `accepted_order > 0` (true of every row) lets PostgreSQL use its partial index of
            // acceptance order (migration 2).
            "SELECT {COMMAND_COLS} FROM commands WHERE tenant_id = $1 AND session_id = $2 AND accepted_order > $3 \
             AND accepted_order > 0 \
             ORDER BY accepted_order LIMIT {limit}"
        );
        let mut p = ts(t, s);
        p.push(int(after_order));
        self.many(&q, p, "command", decode_command).await
    }

    async fn commands_newest(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        limit: usize,
    ) -> StoreResult<Vec<CommandRecord>> {
        let q = format!(
            "SELECT {COMMAND_COLS} FROM commands WHERE tenant_id = $1 AND session_id = $2 \
             AND accepted_order > 0 \
             ORDER BY accepted_order DESC LIMIT {limit}"
        );
        self.many(&q, ts(t, s), "command", decode_command).await
    }

    async fn cursor(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<Option<Cursor>> {
        self.one(
            "SELECT consumed_order, epoch FROM cursors WHERE tenant_id = $1 AND session_id = $2 FOR_UPDATE",
            ts(t, s),
            "cursor",
            |r| {
                Ok(Cursor {
                    consumed_order: r.u64(0)?,
                    epoch: ResidencyEpoch(r.u64(1)?),
                })
            },
        )
        .await
    }

    async fn put_cursor(&mut self, t: &TenantId, s: &SessionId, c: Cursor) -> StoreResult<bool> {
        let mut p = ts(t, s);
        p.push(int(c.consumed_order));
        p.push(int(c.epoch.0));
        let n = self
            .exec(
                "INSERT INTO cursors (tenant_id, session_id, consumed_order, epoch) VALUES ($1,$2,$3,$4) \
                 ON CONFLICT (tenant_id, session_id) DO UPDATE SET consumed_order = excluded.consumed_order, \
                 epoch = excluded.epoch WHERE cursors.epoch <= excluded.epoch \
                 AND cursors.consumed_order <= excluded.consumed_order",
                p,
            )
            .await?;
        Ok(n == 1)
    }

    fn note_presumption(&mut self, undone: bool) {
        // SQLite presumes nothing, so nothing it writes afterwards was missed.
        if undone || self.conn.dialect() == Dialect::Postgres {
            self.conn.counters().presumption(undone);
        }
    }

    async fn admit_command(&mut self, rec: &CommandRecord, now: Millis) -> StoreResult<Admitted> {
        if self.conn.dialect() == Dialect::Postgres {
            return merged::admit(self, rec, now).await;
        }
        let (t, s) = (&rec.tenant, &rec.session);
        if !self.session_exists(t, s).await? {
            return Ok(Admitted {
                session: false,
                existing: None,
                order: None,
            });
        }
        if let Some(existing) = self.command(t, s, &rec.command).await? {
            return Ok(Admitted {
                session: true,
                existing: Some(existing),
                order: None,
            });
        }
        let order = self.take_order(t, s, now).await?;
        let mut admitted = rec.clone();
        admitted.accepted_order = order;
        self.insert_command(&admitted).await?;
        Ok(Admitted {
            session: true,
            existing: None,
            order: Some(order),
        })
    }

    async fn transition_command(&mut self, step: &Transitioning<'_>) -> StoreResult<Option<Found>> {
        if self.conn.dialect() == Dialect::Postgres {
            return merged::transition(self, step).await;
        }
        let Some(before) = self
            .command(step.tenant, step.session, step.command)
            .await?
        else {
            return Ok(None);
        };
        let residency = match step.kind {
            TransitionKind::Claim | TransitionKind::Attempt => {
                self.lease(step.tenant, step.session).await?
            }
            TransitionKind::Reject => None,
        };
        Ok(Some(Found {
            before,
            written: None,
            residency,
        }))
    }

    async fn settle_command(
        &mut self,
        req: &SettleRequest,
        now: Millis,
    ) -> StoreResult<SettleRead> {
        if self.conn.dialect() == Dialect::Postgres {
            return merged::settle(self, req, now).await;
        }
        let session = self.session(&req.tenant, &req.session).await?;
        let before = match &session {
            Some(_) => {
                self.command(&req.tenant, &req.session, &req.command)
                    .await?
            }
            None => None,
        };
        let evidence = match (&session, &before) {
            (Some(s), Some(c)) if c.attempt.is_some() => {
                self.journal_dispositions(
                    &req.tenant,
                    s.binding.runtime_session_id,
                    c.runtime_command,
                )
                .await?
            }
            _ => Vec::new(),
        };
        Ok(SettleRead {
            session,
            before,
            evidence,
            written: None,
        })
    }

    async fn cursor_write(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        order: u64,
        epoch: ResidencyEpoch,
    ) -> StoreResult<CursorRead> {
        if self.conn.dialect() == Dialect::Postgres {
            return merged::cursor(self, t, s, order, epoch).await;
        }
        if !self.session_exists(t, s).await? {
            return Ok(CursorRead {
                session: false,
                current: None,
                wrote: false,
            });
        }
        Ok(CursorRead {
            session: true,
            current: self.cursor(t, s).await?,
            wrote: false,
        })
    }

    async fn append_records(
        &mut self,
        lease: &JournalLease,
        rows: &[JournalRow],
    ) -> StoreResult<Option<Appended>> {
        if self.conn.dialect() == Dialect::Postgres {
            return merged::append(self, lease, rows).await.map(Some);
        }
        Ok(None)
    }

    async fn gate(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        g: &GateId,
    ) -> StoreResult<Option<GateRecord>> {
        let q = format!(
            "SELECT {GATE_COLS} FROM gates WHERE tenant_id = $1 AND session_id = $2 AND gate_id = $3 FOR_UPDATE"
        );
        let mut p = ts(t, s);
        p.push(text(g.as_str()));
        self.one(&q, p, "gate", decode_gate).await
    }

    async fn count_open_gates(&mut self, t: &TenantId, s: &SessionId) -> StoreResult<usize> {
        let rows = self
            .rows(
                "SELECT count(*) FROM gates WHERE tenant_id = $1 AND session_id = $2 AND state = 'open'",
                ts(t, s),
                "gate",
            )
            .await?;
        let n = rows
            .first()
            .ok_or_else(|| StoreError::integrity("gate", "count returned no row"))?
            .u64(0)?;
        Ok(n as usize)
    }

    async fn put_gate(&mut self, g: &GateRecord) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO gates ({GATE_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12) \
             ON CONFLICT (tenant_id, session_id, gate_id) DO UPDATE SET state = excluded.state, \
             resolved_seq = excluded.resolved_seq, resolved_at = excluded.resolved_at"
        );
        self.exec(
            &q,
            vec![
                text(g.tenant.as_str()),
                text(g.session.as_str()),
                text(g.gate.as_str()),
                text(g.opened_event.as_str()),
                int(g.opened_seq),
                text(g.kind.clone()),
                text(g.prompt_summary.clone()),
                ms(g.deadline_ms),
                text(g.state.as_str()),
                ms(g.opened_at_ms),
                opt_int(g.resolved_seq),
                opt_ms(g.resolved_at_ms),
            ],
        )
        .await?;
        Ok(())
    }

    async fn gates(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        open_only: bool,
    ) -> StoreResult<Vec<GateRecord>> {
        let q = if open_only {
            format!(
                "SELECT {GATE_COLS} FROM gates WHERE tenant_id = $1 AND session_id = $2 AND state = 'open' \
                 ORDER BY opened_seq, gate_id"
            )
        } else {
            format!(
                "SELECT {GATE_COLS} FROM gates WHERE tenant_id = $1 AND session_id = $2 ORDER BY opened_seq, gate_id"
            )
        };
        self.many(&q, ts(t, s), "gate", decode_gate).await
    }

    async fn insert_object(&mut self, o: &StoredObject, now: Millis) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO payload_objects ({OBJECT_COLS}, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)"
        );
        self.exec(
            &q,
            vec![
                text(o.reference.object_id.as_str()),
                text(o.tenant.as_str()),
                text(o.session.as_str()),
                text(o.kind.clone()),
                text(o.media_type.clone()),
                int(o.reference.size),
                text(o.reference.sha256.clone()),
                Param::Blob(Some(o.bytes.clone())),
                ms(now),
            ],
        )
        .await?;
        Ok(())
    }

    async fn object(&mut self, id: &ObjectId) -> StoreResult<Option<StoredObject>> {
        let q = format!("SELECT {OBJECT_COLS} FROM payload_objects WHERE object_id = $1");
        self.one(&q, vec![text(id.as_str())], "payload_object", decode_object)
            .await
    }

    async fn journal_lease(
        &mut self,
        rs: RuntimeSessionId,
    ) -> StoreResult<Option<JournalLeaseState>> {
        let q = format!(
            "SELECT {JLEASE_COLS} FROM journal_leases WHERE runtime_session_id = $1 FOR_UPDATE"
        );
        self.one(
            &q,
            vec![text(rs.to_text())],
            "journal_lease",
            decode_journal_lease,
        )
        .await
    }

    async fn put_journal_lease(&mut self, l: &JournalLeaseState) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO journal_leases ({JLEASE_COLS}) VALUES ($1,$2,$3,$4,$5,$6) \
             ON CONFLICT (runtime_session_id) DO UPDATE SET epoch = excluded.epoch, \
             holder = excluded.holder, expires_at = excluded.expires_at, tip = excluded.tip"
        );
        self.exec(
            &q,
            vec![
                text(l.runtime_session.to_text()),
                text(l.tenant.as_str()),
                int(l.epoch.0),
                opt_text(l.holder.clone()),
                opt_ms(l.expires_at_ms),
                int(l.tip),
            ],
        )
        .await?;
        Ok(())
    }

    async fn insert_journal_row(&mut self, row: &JournalRow) -> StoreResult<()> {
        let q = format!(
            "INSERT INTO journal_records ({JOURNAL_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18)"
        );
        let (pub_body, pub_obj) = slot_params(&row.public_body);
        let (priv_body, priv_obj) = slot_params(&row.private_body);
        self.exec(
            &q,
            vec![
                text(row.runtime_session.to_text()),
                int(row.seq),
                text(row.kind.as_str()),
                int(row.epoch.0),
                ms(row.written_at_ms),
                opt_text(row.event.as_ref().map(|e| e.as_str().to_owned())),
                pub_body,
                pub_obj,
                priv_body,
                priv_obj,
                opt_text(row.cause.map(|c| c.to_text())),
                opt_text(row.identity.as_ref().map(|i| i.command.as_str().to_owned())),
                opt_text(row.identity.as_ref().map(|i| i.runtime_command.to_text())),
                opt_text(row.identity.as_ref().map(|i| i.kind.as_str().to_owned())),
                opt_text(row.attempt.map(|a| a.to_text())),
                opt_int(row.attempt_epoch.map(|e| e.0)),
                opt_text(row.outcome.map(|o| o.as_str().to_owned())),
                Param::Blob(row.detail.clone()),
            ],
        )
        .await?;
        Ok(())
    }

    async fn has_disposition(
        &mut self,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<bool> {
        let rows = self
            .rows(
                HAS_DISPOSITION,
                vec![text(rs.to_text()), text(rc.to_text())],
                "journal",
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn has_effect(
        &mut self,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<bool> {
        let rows = self
            .rows(
                "SELECT 1 FROM journal_records WHERE runtime_session_id = $1 AND cause_runtime_command = $2 LIMIT 1",
                vec![text(rs.to_text()), text(rc.to_text())],
                "journal",
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn public_event_count(&mut self, rs: RuntimeSessionId, through: u64) -> StoreResult<u64> {
        let through = through.min(i64::MAX as u64);
        let rows = self
            .rows(
                "SELECT count(*) FROM journal_records WHERE runtime_session_id = $1 \
                 AND kind = 'event' AND seq <= $2",
                vec![text(rs.to_text()), int(through)],
                "journal",
            )
            .await?;
        rows.first()
            .ok_or_else(|| StoreError::integrity("journal", "count returned no row"))?
            .u64(0)
    }

    async fn public_event_rows(
        &mut self,
        rs: RuntimeSessionId,
        skip: u64,
        limit: usize,
    ) -> StoreResult<Vec<JournalRow>> {
        let skip = skip.min(i64::MAX as u64);
        let q = format!(
            "SELECT {JOURNAL_COLS} FROM journal_records WHERE runtime_session_id = $1 \
             AND kind = 'event' ORDER BY seq LIMIT {limit} OFFSET {skip}"
        );
        self.many(&q, vec![text(rs.to_text())], "journal", decode_journal_row)
            .await
    }

    async fn journal_rows(
        &mut self,
        rs: RuntimeSessionId,
        after: u64,
        upto: u64,
        limit: usize,
        events_only: bool,
    ) -> StoreResult<Vec<JournalRow>> {
        let filter = if events_only {
            " AND kind = 'event'"
        } else {
            ""
        };
        let q = format!(
            "SELECT {JOURNAL_COLS} FROM journal_records WHERE runtime_session_id = $1 AND seq > $2 AND seq <= $3{filter} \
             ORDER BY seq LIMIT {limit}"
        );
        let upto = upto.min(i64::MAX as u64);
        self.many(
            &q,
            vec![text(rs.to_text()), int(after), int(upto)],
            "journal",
            decode_journal_row,
        )
        .await
    }

    async fn journal_dispositions(
        &mut self,
        t: &TenantId,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<Vec<JournalRow>> {
        let mut rows = self
            .many(
                &DISPOSITIONS,
                vec![text(rs.to_text()), text(rc.to_text()), text(t.as_str())],
                "journal",
                decode_journal_row,
            )
            .await?;
        rows.sort_by_key(|r| r.seq);
        Ok(rows)
    }
}
