"""The asyncio API's pieces without a broker: delivery reports resolve futures on the loop,
listeners may be async or plain (plain ones never run on the loop), async back-checks run
on the producer's loop and are bounded, the classes refuse misuse with the one error
family, and the loop guard the integration tests rely on catches a blocking call."""

from __future__ import annotations

import asyncio
import threading

import confluent_kafka
import pytest
from confluent_kafka import KafkaError

from rmq_semantics import (
    AsyncConsumer,
    AsyncProducer,
    AsyncTransactionProducer,
    ConfigError,
    LocalTransactionState,
    Message,
    SystemTopicError,
    TransactionListener,
)
from rmq_semantics.aio import bridge
from rmq_semantics.aio.bridge import LoopDeliveryWaiter, LoopListener, call_listener, new_executor
from rmq_semantics.errors import IllegalStateError, KafkaOperationError, RmqTimeoutError
from tests.loop_guard import loop_guard

NO_BROKER = {"bootstrap.servers": "127.0.0.1:1"}
COMMIT = LocalTransactionState.COMMIT_MESSAGE


class _Record:
    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 42


def test_a_delivery_report_from_another_thread_resolves_the_waiter_on_the_loop():
    async def main():
        waiter = LoopDeliveryWaiter(asyncio.get_running_loop())
        threading.Timer(0.05, waiter, args=(None, _Record())).start()
        await waiter.delivered_within("writing", 5)
        return waiter.partition, waiter.offset

    assert asyncio.run(main()) == (3, 42)


def test_a_failed_or_missing_report_raises_the_sync_errors():
    async def main():
        loop = asyncio.get_running_loop()
        failed = LoopDeliveryWaiter(loop)
        threading.Thread(
            target=failed, args=(KafkaError(KafkaError._MSG_TIMED_OUT), _Record())
        ).start()
        with pytest.raises(KafkaOperationError, match="writing: "):
            await failed.delivered_within("writing", 5)
        silent = LoopDeliveryWaiter(loop)
        with pytest.raises(RmqTimeoutError, match=r"no delivery report within 0\.1 s"):
            await silent.delivered_within("writing", 0.1)
        silent(None, _Record())  # a late report after the timeout is harmless
        await asyncio.sleep(0.01)

    asyncio.run(main())


def test_async_listeners_run_on_the_loop_and_plain_ones_on_the_executor():
    where = {}

    class Listener:
        async def execute_local_transaction(self, msg, arg):
            where["async"] = threading.get_ident()
            return COMMIT

        def check_local_transaction(self, msg):
            where["plain"] = threading.get_ident()
            return COMMIT

        def raising(self, msg):
            raise RuntimeError("boom")

    async def main():
        executor = new_executor("test", 2)
        listener = Listener()
        try:
            assert await call_listener(listener.execute_local_transaction, executor, 1, 2) == (
                COMMIT,
                None,
            )
            assert await call_listener(listener.check_local_transaction, executor, 1) == (
                COMMIT,
                None,
            )
            answer, error = await call_listener(listener.raising, executor, 1)
            assert answer is None and isinstance(error, RuntimeError)
        finally:
            executor.shutdown()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert where["async"] == loop_thread and where["plain"] != loop_thread


def test_an_async_check_runs_on_the_producers_loop_and_a_plain_one_on_the_check_thread():
    ran_on = {}

    class Listener(TransactionListener):
        async def check_local_transaction(self, msg):
            ran_on["async"] = threading.get_ident()
            await asyncio.sleep(0.01)
            return COMMIT

    class Plain(TransactionListener):
        def check_local_transaction(self, msg):
            ran_on["plain"] = threading.get_ident()
            return COMMIT

    async def main():
        loop_thread = threading.get_ident()
        checks = LoopListener(Listener(), timeout_s=5)
        checks.loop = asyncio.get_running_loop()
        # The check pool's thread asks; the loop goes on meanwhile.
        answer = await asyncio.to_thread(checks.check_local_transaction, Message("t", b"v"))
        assert answer is COMMIT and ran_on["async"] == loop_thread
        plain = LoopListener(Plain(), timeout_s=5)
        await asyncio.to_thread(plain.check_local_transaction, Message("t", b"v"))
        assert ran_on["plain"] != loop_thread

    asyncio.run(main())


def test_a_hung_async_check_is_bounded_and_cancelled(monkeypatch):
    monkeypatch.setattr(bridge, "CHECK_GRACE_S", 0.0)
    cancelled = threading.Event()

    class Hung(TransactionListener):
        async def check_local_transaction(self, msg):
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async def main():
        checks = LoopListener(Hung(), timeout_s=0.2)
        checks.loop = asyncio.get_running_loop()
        with pytest.raises(RmqTimeoutError, match="did not answer"):
            await asyncio.to_thread(checks.check_local_transaction, Message("t", b"v"))
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert cancelled.is_set()


def test_an_async_check_after_the_loop_closed_is_refused_not_hung():
    class Listener(TransactionListener):
        async def check_local_transaction(self, msg):
            return COMMIT

    checks = LoopListener(Listener(), timeout_s=5)
    loop = asyncio.new_event_loop()
    loop.close()
    checks.loop = loop
    with pytest.raises(IllegalStateError, match="event loop is not running"):
        checks.check_local_transaction(Message("t", b"v"))


def test_the_transaction_producer_refuses_misuse_with_the_error_family():
    with pytest.raises(ConfigError, match="listener must implement"):
        AsyncTransactionProducer(NO_BROKER, producer_group="g", listener=object())
    with pytest.raises(ConfigError, match="check_threads must be a positive int"):
        AsyncTransactionProducer(
            NO_BROKER, producer_group="g", listener=TransactionListener(), check_threads=0
        )
    producer = AsyncTransactionProducer(
        NO_BROKER, producer_group="g", listener=TransactionListener(), check_timeout_ms=1234
    )
    assert producer.settings.check_timeout_ms == 1234

    async def main():
        with pytest.raises(IllegalStateError, match="not started"):
            await producer.send_message_in_transaction(Message("t", b"v"))
        await producer.shutdown()
        await producer.shutdown()  # idempotent
        with pytest.raises(IllegalStateError, match="shut down"):
            await producer.send_transaction([Message("t", b"v")])
        with pytest.raises(IllegalStateError, match="shut down"):
            await producer.start()

    asyncio.run(main())


def test_the_producer_refuses_a_system_topic_and_closes_once():
    async def main():
        async with AsyncProducer(NO_BROKER) as producer:
            with pytest.raises(SystemTopicError):
                await producer.send(Message("__rmq_half", b"v"))
            with pytest.raises(ConfigError, match="not both"):
                await producer.send(Message("t", b"v"), selector=lambda *a: 0, sharding_key="k")
        await producer.close()
        with pytest.raises(IllegalStateError, match="closed"):
            await producer.send(Message("t", b"v"))

    asyncio.run(main())


def test_the_consumer_refuses_a_system_topic_and_close_ends_async_for():
    async def main():
        consumer = AsyncConsumer({**NO_BROKER, "group.id": "g"})
        with pytest.raises(SystemTopicError):
            await consumer.subscribe(["__rmq_op"])
        await consumer.subscribe(["t"])
        received = []

        async def read():
            async for msg in consumer:
                received.append(msg)

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.3)
        await consumer.close()
        await asyncio.wait_for(reader, 5)
        await consumer.close()  # idempotent
        with pytest.raises(IllegalStateError, match="closed"):
            await consumer.poll()
        return received

    assert asyncio.run(main()) == []


def test_the_loop_guard_records_a_blocking_call_on_the_loop_and_only_there(monkeypatch):
    with loop_guard(monkeypatch) as guard:
        producer = confluent_kafka.Producer(NO_BROKER)

        async def main():
            guard.arm()
            producer.poll(0)  # does not wait: allowed
            await asyncio.to_thread(producer.flush, 0.01)  # off the loop: allowed
            producer.flush(0.01)  # on the loop: an offence
            guard.disarm()

        asyncio.run(main())
    assert len(guard.offences) == 1 and guard.offences[0].startswith("Producer.flush on the")
    assert guard.calls_elsewhere["Producer.flush"] == 1
