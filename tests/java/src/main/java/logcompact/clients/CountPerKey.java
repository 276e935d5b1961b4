package logcompact.clients;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * A Kafka Streams application with exactly-once processing ({@code processing.guarantee=exactly_once_v2}): it counts
 * the records of --input per key in a persistent (RocksDB) state store, whose changelog is a compacted topic Streams
 * creates, and writes each key's new count (a decimal string) to --output.
 *
 * <p>It runs until SIGTERM (a clean close) or SIGKILL. One JSON line on stdout per state change ({@code "event":
 * "state"}, from and to), per changelog partition restored ({@code restore_start} with the starting and ending
 * offsets, {@code restore_end} with the records restored) and for an error that stops it ({@code error}: the
 * exception and its causes; exit status 1). The consumer's session timeout is 6 s (Kafka's least), so a killed
 * instance leaves the group soon. Exit status 2 for bad arguments.
 */
public final class CountPerKey {
    private static final String USAGE = "usage: CountPerKey --bootstrap-server HOST:PORT --application-id ID --input TOPIC "
            + "--output TOPIC --state-dir DIR [--commit-interval-ms MS (default 100)]";

    public static void main(String[] args) throws InterruptedException {
        Map<String, String> options = new HashMap<>();
        options.put("--commit-interval-ms", "100");
        List<String> known = List.of("--bootstrap-server", "--application-id", "--input", "--output", "--state-dir", "--commit-interval-ms");
        for (int i = 0; i < args.length; i += 2) {
            if (!known.contains(args[i]) || i + 1 >= args.length) {
                System.err.println("CountPerKey: " + (known.contains(args[i]) ? args[i] + " needs a value" : "unknown option " + args[i]) + "\n" + USAGE);
                System.exit(2);
            }
            options.put(args[i], args[i + 1]);
        }
        for (String name : known) {
            if (!options.containsKey(name)) {
                System.err.println("CountPerKey: missing " + name + "\n" + USAGE);
                System.exit(2);
            }
        }

        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, options.get("--application-id"));
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, options.get("--bootstrap-server"));
        config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, options.get("--commit-interval-ms"));
        config.put(StreamsConfig.STATE_DIR_CONFIG, options.get("--state-dir"));
        config.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        config.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1500);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(options.get("--input"), Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey()
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
                .toStream()
                .mapValues(count -> Long.toString(count))
                .to(options.get("--output"), Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), config);
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean();
        streams.setStateListener((to, from) -> {
            JsonLines.print("event", "state", "from", from.name(), "to", to.name());
            if (to == KafkaStreams.State.ERROR || to == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition partition, String store, long startingOffset, long endingOffset) {
                JsonLines.print("event", "restore_start", "topic", partition.topic(), "partition", partition.partition(), "store", store,
                        "starting_offset", startingOffset, "ending_offset", endingOffset);
            }

            @Override
            public void onBatchRestored(TopicPartition partition, String store, long batchEndOffset, long numRestored) {
            }

            @Override
            public void onRestoreEnd(TopicPartition partition, String store, long totalRestored) {
                JsonLines.print("event", "restore_end", "topic", partition.topic(), "partition", partition.partition(), "store", store,
                        "restored", totalRestored);
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            StringBuilder causes = new StringBuilder(error.toString());
            for (Throwable cause = error.getCause(); cause != null; cause = cause.getCause()) {
                causes.append(": ").append(cause);
            }
            JsonLines.print("event", "error", "error", causes.toString());
            failed.set(true);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(30))));
        streams.start();
        stopped.await();
        streams.close(Duration.ofSeconds(30));
        System.exit(failed.get() ? 1 : 0);
    }
}
