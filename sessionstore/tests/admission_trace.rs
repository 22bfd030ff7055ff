//! The admission of a command is a `command.admit` span in its caller's trace, and the command
//! carries that span's context for whichever Host applies it: on SQLite and PostgreSQL alike,
//! with an OpenTelemetry layer recording into memory.

mod cases {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use opentelemetry::trace::{Status, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, Span, SpanData, SpanProcessor};
    use sessionstore::testing::{TestStore, new_session};
    use sessionstore::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Every span that ends, kept in order.
    #[derive(Clone, Debug, Default)]
    struct Ended(Arc<Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Ended {
        fn on_start(&self, _: &mut Span, _: &opentelemetry::Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    impl Ended {
        fn named(&self, name: &str) -> Vec<SpanData> {
            let all = self.0.lock().unwrap();
            all.iter().filter(|s| s.name == name).cloned().collect()
        }
    }

    fn attr(span: &SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn command(s: &SessionRecord, id: &str, body: Vec<u8>) -> NewCommand {
        NewCommand {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command: CommandId::new(id).unwrap(),
            kind: CommandKind::Input,
            body: CommandBody::Inline(body),
            principal: None,
            metadata: None,
            apply_within: Duration::from_secs(3600),
            trace: trace_context::TraceContext::from_headers(Some(CALLER), Some("vendor=1"))
                .unwrap(),
        }
    }

    pub async fn an_admission_is_a_span_of_the_callers_trace_and_the_command_continues_from_it(
        ts: &TestStore,
    ) {
        let ended = Ended::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(ended.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        // The admissions below run on this thread (the test's own future).
        let _recording = tracing::subscriber::set_default(subscriber);
        let s = new_session(&ts.store, "acme", "traced", "b1").await;

        let (rec, created) = ts
            .store
            .admit_reporting(command(&s, "c1", b"{\"text\":\"hi\"}".to_vec()))
            .await
            .unwrap();
        assert!(created);
        let admits = ended.named("command.admit");
        assert_eq!(admits.len(), 1, "{admits:?}");
        let admit = &admits[0];
        let caller: trace_context::TraceParent = CALLER.parse().unwrap();
        assert_eq!(
            admit.span_context.trace_id().to_bytes(),
            caller.trace_id(),
            "{admit:?}"
        );
        assert_eq!(admit.parent_span_id.to_bytes(), caller.parent_id());
        assert_eq!(attr(admit, "command").as_deref(), Some("c1"));
        assert_eq!(attr(admit, "created").as_deref(), Some("true"));
        assert_eq!(admit.status, Status::Unset);
        // The stored context names the admission span, in the caller's trace, state kept.
        let trace = rec.trace.expect("the command carries its trace");
        assert_eq!(trace.parent.trace_id(), caller.trace_id());
        assert_eq!(
            trace.parent.parent_id(),
            admit.span_context.span_id().to_bytes()
        );
        assert_eq!(
            trace.state.map(|s| s.as_str().to_owned()).as_deref(),
            Some("vendor=1")
        );

        // A retried admission is a span too, says it created nothing, and leaves the stored
        // context as the first admission wrote it.
        let (again, created) = ts
            .store
            .admit_reporting(command(&s, "c1", b"{\"text\":\"hi\"}".to_vec()))
            .await
            .unwrap();
        assert!(!created);
        let admits = ended.named("command.admit");
        assert_eq!(admits.len(), 2);
        assert_eq!(attr(&admits[1], "created").as_deref(), Some("false"));
        assert_eq!(
            again.trace.unwrap().parent.parent_id(),
            admit.span_context.span_id().to_bytes()
        );

        // A refused admission's span carries the refusal's stable code as its error status.
        let oversized = vec![b'x'; sessionstore::limits::MAX_INLINE_BODY_BYTES + 1];
        let refused = ts
            .store
            .admit_reporting(command(&s, "c2", oversized))
            .await
            .unwrap_err();
        let admits = ended.named("command.admit");
        assert_eq!(admits.len(), 3);
        assert_eq!(
            admits[2].status,
            Status::error(refused.code().as_str().to_owned()),
            "{:?}",
            admits[2]
        );
    }
}

sessionstore::both_backends!(cases =>
    an_admission_is_a_span_of_the_callers_trace_and_the_command_continues_from_it,
);
