package logcompact.clients;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's Java producer in transactions, as the tests drive it against the agent and against Apache Kafka's broker:
 * one scenario a run, each call's outcome one JSON line on stdout.
 *
 * <ul>
 * <li>{@code commit-abort-commit}: three transactions of three records into partition 0 of --topic, committed,
 * aborted, committed; keys repeat across them, so compaction has something to do. {@code produced} per record
 * (its transaction's number and outcome, partition, offset, key, value), {@code ended} per transaction, then
 * {@code end_offset} per partition and isolation level.</li>
 * <li>{@code send-offsets}: --num-records records into --input (not transactional), read by a consumer of --group
 * (read_committed, subscribed), copied into --output in a transaction with sendOffsetsToTransaction(offsets, the
 * consumer's group metadata), aborted; the consumer rewinds to its committed offsets and the copy is done again
 * and committed. {@code committed} per partition of --input after each end ({@code offset} null: none).</li>
 * <li>{@code fence}: a first producer of --transactional-id sends three records into partition 0 of --topic; a
 * second producer of the same id initializes; the first then sends into partition 1, commits and aborts, each
 * outcome an {@code error} line (exception class and its cause's) or {@code ok}; the second sends three records
 * into partition 0 and commits; {@code end_offset} lines.</li>
 * <li>{@code read}: every partition of --topic read by a consumer of --isolation (read_committed or
 * read_uncommitted), assigned (no group), from its beginning to the end offset it has under that isolation:
 * {@code end_offset} per partition, then {@code consumed} per record.</li>
 * <li>{@code transaction-version}: the cluster's finalized {@code transaction.version} feature set to --level
 * (UpdateFeatures, as kafka-features.sh does; a downgrade to 1 gives Kafka's first transaction protocol, without
 * KIP-890's epoch per transaction), once every broker answers it: {@code feature} with the level before and
 * after.</li>
 * </ul>
 *
 * <p>Exit status 0; 1 when a call fails that the scenario does not expect to fail, or a wait passes --timeout-ms
 * (default 60000; one line on stderr saying why); 2 for bad arguments.
 */
public final class Transactions {
    private static final String USAGE = "usage: Transactions SCENARIO --bootstrap-server HOST:PORT [--timeout-ms MS] ...\n"
            + "  commit-abort-commit --topic T --transactional-id ID\n"
            + "  send-offsets --input T --output T --group G --transactional-id ID --num-records N\n"
            + "  fence --topic T --transactional-id ID\n"
            + "  read --topic T --isolation read_committed|read_uncommitted\n"
            + "  transaction-version --level N";
    private static final Map<String, List<String>> SCENARIOS = Map.of(
            "commit-abort-commit", List.of("--topic", "--transactional-id"),
            "send-offsets", List.of("--input", "--output", "--group", "--transactional-id", "--num-records"),
            "fence", List.of("--topic", "--transactional-id"),
            "read", List.of("--topic", "--isolation"),
            "transaction-version", List.of("--level"));

    private static final String TRANSACTION_VERSION = "transaction.version";

    private final Map<String, String> options;
    private final String bootstrap;
    private final long timeoutMs;

    private Transactions(Map<String, String> options) {
        this.options = options;
        this.bootstrap = options.get("--bootstrap-server");
        this.timeoutMs = Long.parseLong(options.get("--timeout-ms"));
    }

    public static void main(String[] args) {
        Map<String, String> options;
        try {
            options = parse(args);
        } catch (IllegalArgumentException e) {
            System.err.println("Transactions: " + e.getMessage() + "\n" + USAGE);
            System.exit(2);
            return;
        }
        try {
            Transactions run = new Transactions(options);
            switch (options.get("scenario")) {
                case "commit-abort-commit" -> run.commitAbortCommit();
                case "send-offsets" -> run.sendOffsets();
                case "fence" -> run.fence();
                case "transaction-version" -> run.transactionVersion(Short.parseShort(options.get("--level")));
                default -> run.read(options.get("--topic"), options.get("--isolation"));
            }
        } catch (Exception e) {
            System.err.println("Transactions: " + causes(e));
            System.exit(1);
        }
    }

    private static Map<String, String> parse(String[] args) {
        if (args.length == 0 || !SCENARIOS.containsKey(args[0])) {
            throw new IllegalArgumentException(args.length == 0 ? "no scenario" : "unknown scenario " + args[0]);
        }
        Map<String, String> options = new HashMap<>();
        options.put("scenario", args[0]);
        options.put("--timeout-ms", "60000");
        List<String> known = new ArrayList<>(SCENARIOS.get(args[0]));
        known.addAll(List.of("--bootstrap-server", "--timeout-ms"));
        for (int i = 1; i < args.length; i += 2) {
            if (!known.contains(args[i])) {
                throw new IllegalArgumentException("unknown option " + args[i] + " for " + args[0]);
            }
            if (i + 1 >= args.length) {
                throw new IllegalArgumentException(args[i] + " needs a value");
            }
            options.put(args[i], args[i + 1]);
        }
        for (String name : known) {
            if (!options.containsKey(name)) {
                throw new IllegalArgumentException("missing " + name);
            }
        }
        for (String number : List.of("--timeout-ms", "--num-records", "--level")) {
            if (options.containsKey(number)) {
                try {
                    if (Long.parseLong(options.get(number)) < 1) {
                        throw new IllegalArgumentException(number + " out of range: " + options.get(number));
                    }
                } catch (NumberFormatException e) {
                    throw new IllegalArgumentException(number + " is not a number: " + options.get(number));
                }
            }
        }
        if (options.containsKey("--isolation") && !List.of("read_committed", "read_uncommitted").contains(options.get("--isolation"))) {
            throw new IllegalArgumentException("--isolation must be read_committed or read_uncommitted, not " + options.get("--isolation"));
        }
        return options;
    }

    // -- scenarios ----------------------------------------------------------------------------------------------

    private void commitAbortCommit() throws Exception {
        String topic = options.get("--topic");
        String[][][] transactions = {
            {{"k1", "a1"}, {"k2", "b1"}, {"k3", "c1"}},
            {{"k1", "x1"}, {"k2", "y1"}, {"k4", "z1"}},
            {{"k1", "a2"}, {"k2", "b2"}, {"k5", "e1"}},
        };
        String[] outcomes = {"commit", "abort", "commit"};
        try (KafkaProducer<String, String> producer = transactional(options.get("--transactional-id"))) {
            producer.initTransactions();
            for (int n = 0; n < transactions.length; n++) {
                producer.beginTransaction();
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (String[] record : transactions[n]) {
                    sent.add(producer.send(new ProducerRecord<>(topic, 0, record[0], record[1])));
                }
                producer.flush();
                for (int i = 0; i < sent.size(); i++) {
                    RecordMetadata metadata = sent.get(i).get(timeoutMs, TimeUnit.MILLISECONDS);
                    JsonLines.print("event", "produced", "transaction", n, "outcome", outcomes[n], "partition", metadata.partition(),
                            "offset", metadata.offset(), "key", transactions[n][i][0], "value", transactions[n][i][1]);
                }
                if (outcomes[n].equals("commit")) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
                JsonLines.print("event", "ended", "transaction", n, "outcome", outcomes[n]);
            }
        }
        printEndOffsets(topic);
    }

    private void sendOffsets() throws Exception {
        String input = options.get("--input");
        String output = options.get("--output");
        int records = Integer.parseInt(options.get("--num-records"));
        Properties plain = producerConfig();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(plain, new StringSerializer(), new StringSerializer())) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < records; i++) {
                sent.add(producer.send(new ProducerRecord<>(input, "key-" + i, "value-" + i)));
            }
            for (Future<RecordMetadata> future : sent) {
                future.get(timeoutMs, TimeUnit.MILLISECONDS);
            }
        }
        Properties consumerConfig = consumerConfig("read_committed");
        consumerConfig.put(ConsumerConfig.GROUP_ID_CONFIG, options.get("--group"));
        consumerConfig.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerConfig, new StringDeserializer(), new StringDeserializer());
             KafkaProducer<String, String> producer = transactional(options.get("--transactional-id"))) {
            consumer.subscribe(List.of(input));
            producer.initTransactions();
            for (String outcome : List.of("abort", "commit")) {
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                List<ConsumerRecord<String, String>> polled = pollRecords(consumer, records, next);
                producer.beginTransaction();
                for (ConsumerRecord<String, String> record : polled) {
                    producer.send(new ProducerRecord<>(output, record.key(), "copy-" + record.value()));
                }
                producer.flush();  // an abort drops the batches not yet sent: every copy is written, then aborted
                producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                if (outcome.equals("commit")) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
                JsonLines.print("event", "ended", "outcome", outcome, "records", polled.size());
                Set<TopicPartition> partitions = new HashSet<>(consumer.assignment());
                Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(partitions, Duration.ofMillis(timeoutMs));
                for (TopicPartition partition : partitions) {
                    OffsetAndMetadata offset = committed.get(partition);
                    JsonLines.print("event", "committed", "after", outcome, "partition", partition.partition(),
                            "offset", offset == null ? null : offset.offset());
                    if (offset == null) {
                        consumer.seekToBeginning(List.of(partition));
                    } else {
                        consumer.seek(partition, offset);
                    }
                }
            }
        }
    }

    private void fence() throws Exception {
        String topic = options.get("--topic");
        String id = options.get("--transactional-id");
        KafkaProducer<String, String> first = transactional(id);
        try {
            first.initTransactions();
            first.beginTransaction();
            sendAndPrint(first, "first", topic, 0, 3);
            try (KafkaProducer<String, String> second = transactional(id)) {
                second.initTransactions();
                JsonLines.print("event", "initialized", "producer", "second");
                Future<RecordMetadata> late = first.send(new ProducerRecord<>(topic, 1, "first-late", "first-late"));
                outcome("send", () -> late.get(timeoutMs, TimeUnit.MILLISECONDS));
                outcome("commit", () -> {
                    first.commitTransaction();
                    return null;
                });
                outcome("abort", () -> {
                    first.abortTransaction();
                    return null;
                });
                second.beginTransaction();
                sendAndPrint(second, "second", topic, 0, 3);
                second.commitTransaction();
                JsonLines.print("event", "ended", "producer", "second", "outcome", "commit");
            }
        } finally {
            first.close(Duration.ZERO);
        }
        printEndOffsets(topic);
    }

    private void read(String topic, String isolation) throws Exception {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerConfig(isolation), new StringDeserializer(), new StringDeserializer())) {
            List<TopicPartition> partitions = partitions(consumer, topic);
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofMillis(timeoutMs));
            for (TopicPartition partition : partitions) {
                JsonLines.print("event", "end_offset", "isolation", isolation, "partition", partition.partition(), "offset", ends.get(partition));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            while (true) {
                List<TopicPartition> behind = new ArrayList<>();
                for (TopicPartition partition : partitions) {
                    if (consumer.position(partition, Duration.ofMillis(timeoutMs)) < ends.get(partition)) {
                        behind.add(partition);
                    }
                }
                if (behind.isEmpty()) {
                    return;
                }
                if (System.nanoTime() > deadline) {
                    throw new TimeoutException("end offsets " + ends + " not reached within " + timeoutMs + " ms by " + behind
                            + " (positions " + positions(consumer, behind) + ")");
                }
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    JsonLines.print("event", "consumed", "isolation", isolation, "partition", record.partition(), "offset", record.offset(),
                            "key", record.key(), "value", record.value());
                }
            }
        }
    }

    private void transactionVersion(short level) throws Exception {
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) Math.min(Integer.MAX_VALUE, timeoutMs));
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        try (Admin admin = Admin.create(config)) {
            short before = transactionVersion(admin);
            if (before != level) {
                FeatureUpdate.UpgradeType type = level < before ? FeatureUpdate.UpgradeType.SAFE_DOWNGRADE : FeatureUpdate.UpgradeType.UPGRADE;
                admin.updateFeatures(Map.of(TRANSACTION_VERSION, new FeatureUpdate(level, type)), new UpdateFeaturesOptions()).all().get();
            }
            while (transactionVersion(admin) != level) {
                if (System.nanoTime() > deadline) {
                    throw new TimeoutException(TRANSACTION_VERSION + " not " + level + " within " + timeoutMs + " ms");
                }
                Thread.sleep(100);
            }
            JsonLines.print("event", "feature", "name", TRANSACTION_VERSION, "before", before, "level", level);
        }
    }

    private static short transactionVersion(Admin admin) throws Exception {
        FinalizedVersionRange range = admin.describeFeatures().featureMetadata().get().finalizedFeatures().get(TRANSACTION_VERSION);
        return range == null ? 0 : range.maxVersionLevel();
    }

    // -- helpers ------------------------------------------------------------------------------------------------

    private interface Call {
        Object run() throws Exception;
    }

    /** `ok`, or the exception `call` ended with (an ExecutionException's cause), as one line: a fenced producer's
     * calls are expected to fail, and how is what the tests compare. */
    private static void outcome(String operation, Call call) {
        try {
            call.run();
            JsonLines.print("event", "ok", "producer", "first", "operation", operation);
        } catch (Exception e) {
            Throwable error = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            JsonLines.print("event", "error", "producer", "first", "operation", operation, "exception", error.getClass().getName(),
                    "cause", error.getCause() == null ? null : error.getCause().getClass().getName(), "message", error.getMessage());
        }
    }

    private void sendAndPrint(KafkaProducer<String, String> producer, String name, String topic, int partition, int count) throws Exception {
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            sent.add(producer.send(new ProducerRecord<>(topic, partition, name + "-" + i, name + "-" + i)));
        }
        producer.flush();
        for (int i = 0; i < count; i++) {
            RecordMetadata metadata = sent.get(i).get(timeoutMs, TimeUnit.MILLISECONDS);
            JsonLines.print("event", "produced", "producer", name, "partition", metadata.partition(), "offset", metadata.offset(),
                    "key", name + "-" + i, "value", name + "-" + i);
        }
    }

    /** `count` records polled by a subscribed consumer, and the offset after each partition's last one in `next`. */
    private List<ConsumerRecord<String, String>> pollRecords(KafkaConsumer<String, String> consumer, int count,
                                                             Map<TopicPartition, OffsetAndMetadata> next) throws TimeoutException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        List<ConsumerRecord<String, String>> polled = new ArrayList<>();
        while (polled.size() < count) {
            if (System.nanoTime() > deadline) {
                throw new TimeoutException(polled.size() + " of " + count + " records polled within " + timeoutMs + " ms");
            }
            for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                polled.add(record);
                next.put(new TopicPartition(record.topic(), record.partition()), new OffsetAndMetadata(record.offset() + 1));
            }
        }
        return polled;
    }

    private void printEndOffsets(String topic) {
        for (String isolation : List.of("read_committed", "read_uncommitted")) {
            try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerConfig(isolation), new StringDeserializer(), new StringDeserializer())) {
                List<TopicPartition> partitions = partitions(consumer, topic);
                Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofMillis(timeoutMs));
                for (TopicPartition partition : partitions) {
                    JsonLines.print("event", "end_offset", "isolation", isolation, "partition", partition.partition(), "offset", ends.get(partition));
                }
            }
        }
    }

    private List<TopicPartition> partitions(KafkaConsumer<String, String> consumer, String topic) {
        List<TopicPartition> partitions = new ArrayList<>();
        for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofMillis(timeoutMs))) {
            partitions.add(new TopicPartition(topic, info.partition()));
        }
        partitions.sort((a, b) -> Integer.compare(a.partition(), b.partition()));
        return partitions;
    }

    private static Map<TopicPartition, Long> positions(KafkaConsumer<String, String> consumer, List<TopicPartition> partitions) {
        Map<TopicPartition, Long> positions = new HashMap<>();
        for (TopicPartition partition : partitions) {
            positions.put(partition, consumer.position(partition));
        }
        return positions;
    }

    private Properties producerConfig() {
        Properties config = new Properties();
        config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, timeoutMs);
        return config;
    }

    private KafkaProducer<String, String> transactional(String transactionalId) {
        Properties config = producerConfig();
        config.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        config.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 60000);
        return new KafkaProducer<>(config, new StringSerializer(), new StringSerializer());
    }

    private Properties consumerConfig(String isolation) {
        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        config.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        config.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) Math.min(Integer.MAX_VALUE, timeoutMs));
        return config;
    }

    private static String causes(Throwable e) {
        StringBuilder text = new StringBuilder(e.toString());
        for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
            text.append(": ").append(cause);
        }
        return text.toString();
    }
}
