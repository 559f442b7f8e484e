/*
 * The bench's `rocketmq` case (benchmarks/rocketmq.py): Apache RocketMQ's remoting client
 * (TransactionMQProducer / DefaultMQProducer + DefaultMQPushConsumer in one JVM) against the
 * name server and broker the case started on 127.0.0.1. Compiled by the case on first use.
 *
 *   java -cp CLASSES:LIB/* TxBench MODE ns=HOST:PORT broker=HOST:PORT [key=value ...]
 *
 * MODE
 *   tput-tx   closed-loop transactional sends (local tx always COMMIT), `threads` senders, for `duration` s
 *             after `warmup` s; a push consumer on the same topic counts first deliveries.
 *   tput-raw  same with plain DefaultMQProducer.send.
 *   latency   transactional sends paced at `rate` msg/s (open loop over `senders` threads); time from the
 *             moment executeLocalTransaction returns COMMIT (just before endTransaction) to the consumer
 *             listener receiving the message. `samples=PATH` writes each measured latency (ms), one a line.
 *   check     transactional sends at `rate` msg/s for `duration` s whose local tx returns UNKNOW; time from
 *             that return to the first checkLocalTransaction call (which answers COMMIT); the consumer then
 *             confirms delivery.
 * Output: human lines plus one "RESULT mode=... key=value ..." line, which the case parses.
 */
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public class TxBench {
    static final Map<String, String> OPT = new HashMap<>();

    static String s(String k, String d) { return OPT.getOrDefault(k, d); }
    static int i(String k, int d) { return Integer.parseInt(s(k, Integer.toString(d))); }
    static double dbl(String k, double d) { return Double.parseDouble(s(k, Double.toString(d))); }

    static final String PROP = "bi"; // sequence number of the message within this run

    // per-run state
    static AtomicLongArray t0Ns;     // commit (or UNKNOW) timestamp per sequence number
    static AtomicLongArray checkNs;  // first checkLocalTransaction per sequence number
    static AtomicLongArray recvNs;   // first consumer delivery per sequence number
    static final LongAdder received = new LongAdder();
    static final LongAdder dupReceived = new LongAdder();
    static final LongAdder checks = new LongAdder();
    static final LongAdder dupChecks = new LongAdder();
    static volatile boolean STOP = false;
    static volatile LocalTransactionState localResult = LocalTransactionState.COMMIT_MESSAGE;

    static int seqOf(Message m) {
        String v = m.getUserProperty(PROP);
        if (v == null) return -1;
        try { return Integer.parseInt(v); } catch (NumberFormatException e) { return -1; }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: TxBench tput-tx|tput-raw|latency|check [key=value ...]");
            System.exit(2);
        }
        Locale.setDefault(Locale.ROOT); // "2.30", not "2,30": the case parses these numbers
        String mode = args[0];
        for (int k = 1; k < args.length; k++) {
            String[] kv = args[k].split("=", 2);
            OPT.put(kv[0], kv.length > 1 ? kv[1] : "true");
        }
        String ns = s("ns", "127.0.0.1:9876");
        String brokerAddr = s("broker", "127.0.0.1:10911");
        String run = s("run", Long.toString(System.currentTimeMillis()));
        String tag = mode.replace('-', '_') + "_" + run;
        String topic = s("topic", "bench_" + tag);
        int queues = i("queues", 8);

        createTopic(ns, brokerAddr, topic, queues);
        int rc;
        switch (mode) {
            case "tput-tx": rc = tput(true, ns, topic, tag, queues); break;
            case "tput-raw": rc = tput(false, ns, topic, tag, queues); break;
            case "latency": rc = latency(ns, topic, tag, queues); break;
            case "check": rc = check(ns, topic, tag, queues); break;
            default: System.err.println("unknown mode " + mode); rc = 2;
        }
        System.exit(rc);
    }

    static void createTopic(String ns, String brokerAddr, String topic, int queues) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(ns);
        admin.setInstanceName("admin" + System.nanoTime());
        admin.start();
        try {
            TopicConfig tc = new TopicConfig(topic, queues, queues, 6 /* PERM_READ|PERM_WRITE */);
            admin.createAndUpdateTopicConfig(brokerAddr, tc);
            long deadline = System.currentTimeMillis() + 15000;
            while (true) {
                try {
                    if (!admin.examineTopicRouteInfo(topic).getQueueDatas().isEmpty()) break;
                } catch (Exception e) {
                    if (System.currentTimeMillis() > deadline) throw e;
                }
                Thread.sleep(200);
            }
        } finally {
            admin.shutdown();
        }
    }

    static MessageListenerConcurrently countingListener() {
        return (msgs, ctx) -> {
            long now = System.nanoTime();
            for (MessageExt m : msgs) {
                int k = seqOf(m);
                if (k < 0 || k >= recvNs.length()) continue;
                if (recvNs.compareAndSet(k, 0, now)) received.increment(); else dupReceived.increment();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        };
    }

    static DefaultMQPushConsumer startConsumer(String ns, String topic, String tag, int queues) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer("bench_c_" + tag);
        c.setNamesrvAddr(ns);
        c.setInstanceName("c_" + tag);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setConsumeThreadMin(i("cthreads", 20));
        c.setConsumeThreadMax(i("cthreads", 20));
        c.subscribe(topic, "*");
        c.registerMessageListener(countingListener());
        c.start();
        long deadline = System.currentTimeMillis() + 30000;
        while (c.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable().size() < queues) {
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException("consumer rebalance did not assign all queues");
            Thread.sleep(100);
        }
        return c;
    }

    static TransactionMQProducer startTxProducer(String ns, String tag) throws Exception {
        TransactionMQProducer p = new TransactionMQProducer("bench_p_" + tag);
        p.setNamesrvAddr(ns);
        p.setInstanceName("p_" + tag);
        p.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                LocalTransactionState r = localResult;
                int k = seqOf(msg);
                if (k >= 0 && t0Ns != null && k < t0Ns.length()) t0Ns.set(k, System.nanoTime());
                return r; // endTransaction(r) is sent by the client right after this returns
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                long now = System.nanoTime();
                int k = seqOf(msg);
                if (k >= 0 && checkNs != null && k < checkNs.length()) {
                    if (checkNs.compareAndSet(k, 0, now)) checks.increment(); else dupChecks.increment();
                }
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        p.start();
        return p;
    }

    static byte[] body(int size) {
        byte[] b = new byte[size];
        ThreadLocalRandom.current().nextBytes(b);
        return b;
    }

    // ---------------------------------------------------------------- throughput
    static int tput(boolean tx, String ns, String topic, String tag, int queues) throws Exception {
        final int threads = i("threads", 32);
        final int size = i("size", 1024);
        final int warmup = i("warmup", 5);
        final int duration = i("duration", 60);
        final int drain = i("drain", 30);
        final int cap = i("cap", 4_000_000);
        recvNs = new AtomicLongArray(cap);
        t0Ns = null;
        checkNs = new AtomicLongArray(cap);
        localResult = LocalTransactionState.COMMIT_MESSAGE;

        DefaultMQPushConsumer consumer = startConsumer(ns, topic, tag, queues);
        final DefaultMQProducer producer;
        if (tx) {
            producer = startTxProducer(ns, tag);
        } else {
            producer = new DefaultMQProducer("bench_p_" + tag);
            producer.setNamesrvAddr(ns);
            producer.setInstanceName("p_" + tag);
            producer.start();
        }
        final AtomicLong seq = new AtomicLong();
        final LongAdder ok = new LongAdder();
        final LongAdder fail = new LongAdder();
        final long[][] rts = new long[threads][];
        final int[] rtn = new int[threads];
        final long[][] ends = new long[threads][];
        STOP = false;
        List<Thread> ts = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int ti = t;
            rts[t] = new long[1 << 16];
            ends[t] = new long[1 << 16];
            Thread th = new Thread(() -> {
                byte[] b = body(size);
                while (!STOP) {
                    long k = seq.getAndIncrement();
                    if (k >= cap) break;
                    Message m = new Message(topic, b);
                    m.putUserProperty(PROP, Long.toString(k));
                    long s0 = System.nanoTime();
                    boolean good;
                    try {
                        if (tx) {
                            TransactionSendResult r = ((TransactionMQProducer) producer).sendMessageInTransaction(m, null);
                            good = r.getSendStatus() == SendStatus.SEND_OK && r.getLocalTransactionState() == LocalTransactionState.COMMIT_MESSAGE;
                        } else {
                            SendResult r = producer.send(m);
                            good = r.getSendStatus() == SendStatus.SEND_OK;
                        }
                    } catch (Exception e) {
                        good = false;
                    }
                    long s1 = System.nanoTime();
                    if (good) ok.increment(); else fail.increment();
                    if (rtn[ti] == rts[ti].length) {
                        rts[ti] = Arrays.copyOf(rts[ti], rtn[ti] * 2);
                        ends[ti] = Arrays.copyOf(ends[ti], rtn[ti] * 2);
                    }
                    rts[ti][rtn[ti]] = s1 - s0;
                    ends[ti][rtn[ti]] = s1;
                    rtn[ti]++;
                }
            }, "sender-" + t);
            ts.add(th);
        }
        long tStart = System.nanoTime();
        for (Thread th : ts) th.start();
        Thread.sleep(warmup * 1000L);
        long w0 = System.nanoTime();
        long ok0 = ok.sum(), fail0 = fail.sum(), rcv0 = received.sum();
        // per-second progress
        for (int sec = 1; sec <= duration; sec++) {
            LockSupport.parkNanos(w0 + sec * 1_000_000_000L - System.nanoTime());
            if (sec % 10 == 0) {
                System.out.printf("  t=%3ds sent_ok=%d recv=%d fail=%d%n", sec, ok.sum() - ok0, received.sum() - rcv0, fail.sum() - fail0);
            }
        }
        long w1 = System.nanoTime();
        long ok1 = ok.sum(), fail1 = fail.sum(), rcv1 = received.sum();
        STOP = true;
        for (Thread th : ts) th.join();
        long sendEnd = System.nanoTime();
        long totalOk = ok.sum();
        long drainDeadline = System.nanoTime() + drain * 1_000_000_000L;
        while (received.sum() < totalOk && System.nanoTime() < drainDeadline) Thread.sleep(20);
        long totalRcv = received.sum();
        // time of last first-delivery
        long lastRecv = 0;
        for (int k = 0; k < Math.min(cap, (int) seq.get()); k++) lastRecv = Math.max(lastRecv, recvNs.get(k));
        producer.shutdown();
        consumer.shutdown();

        double win = (w1 - w0) / 1e9;
        double sendRate = (ok1 - ok0) / win;
        double recvRate = (rcv1 - rcv0) / win;
        double e2eRate = totalRcv / ((lastRecv - tStart) / 1e9);
        // send RT percentiles within the window
        long[] all = new long[Arrays.stream(rtn).sum()];
        int n = 0;
        for (int t = 0; t < threads; t++) {
            for (int j = 0; j < rtn[t]; j++) {
                if (ends[t][j] >= w0 && ends[t][j] <= w1) all[n++] = rts[t][j];
            }
        }
        long[] win_rts = Arrays.copyOf(all, n);
        Arrays.sort(win_rts);
        String kind = tx ? "tput-tx" : "tput-raw";
        System.out.printf("%s: threads=%d size=%d window=%.1fs sent_ok/s=%.0f recv/s=%.0f fail_in_window=%d%n",
            kind, threads, size, win, sendRate, recvRate, fail1 - fail0);
        System.out.printf("  totals: sent_ok=%d recv_first=%d missing=%d dup_recv=%d fail=%d drain=%.1fs e2e(all msgs, first send->last recv)=%.0f/s unexpected_checks=%d%n",
            totalOk, totalRcv, totalOk - totalRcv, dupReceived.sum(), fail.sum(), (System.nanoTime() - sendEnd) / 1e9, e2eRate, checks.sum());
        System.out.printf("  send RT in window: p50=%.2fms p99=%.2fms max=%.2fms%n",
            pct(win_rts, 50) / 1e6, pct(win_rts, 99) / 1e6, (n > 0 ? win_rts[n - 1] : 0) / 1e6);
        System.out.printf("RESULT mode=%s send_per_s=%.0f recv_per_s=%.0f e2e_per_s=%.0f sent_ok=%d recv=%d missing=%d fail=%d rt_p50_ms=%.2f rt_p99_ms=%.2f%n",
            kind, sendRate, recvRate, e2eRate, totalOk, totalRcv, totalOk - totalRcv, fail.sum(), pct(win_rts, 50) / 1e6, pct(win_rts, 99) / 1e6);
        return 0;
    }

    static long pct(long[] sorted, double p) {
        if (sorted.length == 0) return 0;
        int idx = (int) Math.ceil(p / 100.0 * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(sorted.length - 1, idx))];
    }

    // ---------------------------------------------------------------- paced sender shared by latency/check
    static long[] paced(TransactionMQProducer p, String topic, int size, double rate, int total, int senders,
                        LongAdder ok, LongAdder fail) throws Exception {
        final AtomicLong seq = new AtomicLong();
        final long t0 = System.nanoTime() + 200_000_000L;
        final long[] maxLagNs = new long[senders];
        final long[] lastEnd = new long[senders];
        List<Thread> ts = new ArrayList<>();
        for (int t = 0; t < senders; t++) {
            final int ti = t;
            Thread th = new Thread(() -> {
                byte[] b = body(size);
                while (true) {
                    long k = seq.getAndIncrement();
                    if (k >= total) break;
                    long target = t0 + (long) (k * 1e9 / rate);
                    long wait;
                    while ((wait = target - System.nanoTime()) > 0) LockSupport.parkNanos(wait);
                    maxLagNs[ti] = Math.max(maxLagNs[ti], System.nanoTime() - target);
                    Message m = new Message(topic, b);
                    m.putUserProperty(PROP, Long.toString(k));
                    try {
                        TransactionSendResult r = p.sendMessageInTransaction(m, null);
                        if (r.getSendStatus() == SendStatus.SEND_OK) ok.increment(); else fail.increment();
                    } catch (Exception e) {
                        fail.increment();
                    }
                    lastEnd[ti] = System.nanoTime();
                }
            }, "paced-" + t);
            ts.add(th);
            th.start();
        }
        for (Thread th : ts) th.join();
        long end = Arrays.stream(lastEnd).max().getAsLong();
        long lag = Arrays.stream(maxLagNs).max().getAsLong();
        return new long[] {t0, end, lag};
    }

    // ---------------------------------------------------------------- commit-to-visible latency
    static int latency(String ns, String topic, String tag, int queues) throws Exception {
        final double rate = dbl("rate", 1000);
        final int warmup = i("warmup", 5);
        final int duration = i("duration", 60);
        final int size = i("size", 1024);
        final int senders = i("senders", 16);
        final int total = (int) (rate * (warmup + duration));
        final int skip = (int) (rate * warmup);
        t0Ns = new AtomicLongArray(total);
        recvNs = new AtomicLongArray(total);
        checkNs = new AtomicLongArray(total);
        localResult = LocalTransactionState.COMMIT_MESSAGE;
        DefaultMQPushConsumer consumer = startConsumer(ns, topic, tag, queues);
        TransactionMQProducer p = startTxProducer(ns, tag);
        LongAdder ok = new LongAdder(), fail = new LongAdder();
        long[] r = paced(p, topic, size, rate, total, senders, ok, fail);
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (received.sum() < ok.sum() && System.nanoTime() < deadline) Thread.sleep(20);
        p.shutdown();
        consumer.shutdown();
        double achieved = total / ((r[1] - r[0]) / 1e9);
        long[] lat = new long[total - skip];
        int n = 0, missing = 0;
        for (int k = skip; k < total; k++) {
            long a = t0Ns.get(k), b = recvNs.get(k);
            if (a == 0 || b == 0) { missing++; continue; }
            lat[n++] = b - a;
        }
        lat = Arrays.copyOf(lat, n);
        Arrays.sort(lat);
        double mean = n == 0 ? 0 : Arrays.stream(lat).average().getAsDouble();
        String samples = s("samples", "");
        if (!samples.isEmpty()) {
            try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(Paths.get(samples)))) {
                for (long v : lat) w.printf("%.3f%n", v / 1e6);
            }
        }
        System.out.printf("latency: offered=%.0f/s achieved=%.0f/s senders=%d max_schedule_lag=%.1fms measured=%d (after %ds warm-up) missing=%d fail=%d%n",
            rate, achieved, senders, r[2] / 1e6, n, warmup, missing, fail.sum());
        System.out.printf("  commit->visible: p50=%.2fms p90=%.2fms p99=%.2fms p99.9=%.2fms max=%.2fms mean=%.2fms%n",
            pct(lat, 50) / 1e6, pct(lat, 90) / 1e6, pct(lat, 99) / 1e6, pct(lat, 99.9) / 1e6, (n > 0 ? lat[n - 1] : 0) / 1e6, mean / 1e6);
        System.out.printf("RESULT mode=latency offered=%.0f achieved=%.0f n=%d missing=%d p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f p999_ms=%.2f max_ms=%.2f mean_ms=%.2f%n",
            rate, achieved, n, missing, pct(lat, 50) / 1e6, pct(lat, 90) / 1e6, pct(lat, 99) / 1e6, pct(lat, 99.9) / 1e6, (n > 0 ? lat[n - 1] : 0) / 1e6, mean / 1e6);
        return 0;
    }

    // ---------------------------------------------------------------- UNKNOW -> back-check latency
    static int check(String ns, String topic, String tag, int queues) throws Exception {
        final double rate = dbl("rate", 20);
        final int duration = i("duration", 60);
        final int waitS = i("wait", 50);
        final int size = i("size", 1024);
        final int total = (int) (rate * duration);
        t0Ns = new AtomicLongArray(total);
        recvNs = new AtomicLongArray(total);
        checkNs = new AtomicLongArray(total);
        localResult = LocalTransactionState.UNKNOW;
        DefaultMQPushConsumer consumer = startConsumer(ns, topic, tag, queues);
        TransactionMQProducer p = startTxProducer(ns, tag);
        LongAdder ok = new LongAdder(), fail = new LongAdder();
        long[] r = paced(p, topic, size, rate, total, i("senders", 4), ok, fail);
        long deadline = r[1] + waitS * 1_000_000_000L;
        while ((checks.sum() < ok.sum() || received.sum() < ok.sum()) && System.nanoTime() < deadline) Thread.sleep(50);
        // give late duplicate checks a moment to show up, then stop
        Thread.sleep(500);
        p.shutdown();
        consumer.shutdown();
        long[] lat = new long[total];
        long[] vis = new long[total];
        int n = 0, nv = 0, unchecked = 0;
        for (int k = 0; k < total; k++) {
            long a = t0Ns.get(k), c = checkNs.get(k), v = recvNs.get(k);
            if (a == 0) continue;
            if (c == 0) { unchecked++; continue; }
            lat[n++] = c - a;
            if (v != 0) vis[nv++] = v - a;
        }
        lat = Arrays.copyOf(lat, n);
        vis = Arrays.copyOf(vis, nv);
        Arrays.sort(lat);
        Arrays.sort(vis);
        System.out.printf("check: sent UNKNOW=%d at %.0f/s over %ds, checked=%d unchecked_after_wait=%d dup_checks=%d delivered_after_commit=%d%n",
            ok.sum(), rate, duration, n, unchecked, dupChecks.sum(), nv);
        System.out.printf("  UNKNOW->first check: min=%.0fms p50=%.0fms p90=%.0fms p99=%.0fms max=%.0fms%n",
            (n > 0 ? lat[0] : 0) / 1e6, pct(lat, 50) / 1e6, pct(lat, 90) / 1e6, pct(lat, 99) / 1e6, (n > 0 ? lat[n - 1] : 0) / 1e6);
        System.out.printf("  UNKNOW->visible (check answered COMMIT): p50=%.0fms p99=%.0fms max=%.0fms%n",
            pct(vis, 50) / 1e6, pct(vis, 99) / 1e6, (nv > 0 ? vis[nv - 1] : 0) / 1e6);
        System.out.printf("RESULT mode=check sent=%d checked=%d unchecked=%d dup_checks=%d delivered=%d min_ms=%.0f p50_ms=%.0f p90_ms=%.0f p99_ms=%.0f max_ms=%.0f vis_p50_ms=%.0f vis_p99_ms=%.0f%n",
            ok.sum(), n, unchecked, dupChecks.sum(), nv, (n > 0 ? lat[0] : 0) / 1e6, pct(lat, 50) / 1e6, pct(lat, 90) / 1e6, pct(lat, 99) / 1e6, (n > 0 ? lat[n - 1] : 0) / 1e6,
            pct(vis, 50) / 1e6, pct(vis, 99) / 1e6);
        return 0;
    }
}
