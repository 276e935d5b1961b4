package logcompact.clients;

import java.io.FileReader;
import java.io.IOException;
import java.io.Reader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's Java producer sends records to a topic, then its consumer reads every partition of the topic from its
 * beginning to its end offset, as the tests drive it against the agent and against Apache Kafka's broker.
 *
 * <p>Record i has the key {@code <key-prefix>-<i mod num-keys>} and the value {@code value-<i>}. One JSON line on
 * stdout per record acknowledged ({@code "event": "produced"}) and per record read ({@code "event": "consumed"}),
 * each with its partition and offset. The producer runs with the client's defaults (acks=all, idempotence on); the
 * consumer is assigned the partitions (no group). Exit status 0; 1 when a send fails or sending and reading back take
 * longer than --timeout-ms in all (one line on stderr saying why); 2 for bad arguments.
 */
public final class ProduceConsume {
    private static final String USAGE = "usage: ProduceConsume --bootstrap-server HOST:PORT --topic TOPIC "
            + "--num-records N [--num-keys K (default N)] [--key-prefix P (default key)] [--timeout-ms MS (default 30000)] "
            + "[--command-config FILE (client properties, e.g. security.protocol, for the producer and the consumer)]";

    public static void main(String[] args) {
        Map<String, String> options;
        try {
            options = parse(args);
        } catch (IllegalArgumentException e) {
            System.err.println("ProduceConsume: " + e.getMessage() + "\n" + USAGE);
            System.exit(2);
            return;
        }
        try {
            run(options);
        } catch (Exception e) {
            StringBuilder causes = new StringBuilder(e.toString());
            for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
                causes.append(": ").append(cause);
            }
            System.err.println("ProduceConsume: " + causes);
            System.exit(1);
        }
    }

    /** The --command-config file's properties (as Kafka's tools read theirs), or none. */
    private static Properties commandConfig(Map<String, String> options) throws IOException {
        Properties properties = new Properties();
        String path = options.get("--command-config");
        if (path != null) {
            try (Reader reader = new FileReader(path)) {
                properties.load(reader);
            }
        }
        return properties;
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> options = new HashMap<>();
        options.put("--key-prefix", "key");
        options.put("--timeout-ms", "30000");
        for (int i = 0; i < args.length; i += 2) {
            String name = args[i];
            if (!List.of("--bootstrap-server", "--topic", "--num-records", "--num-keys", "--key-prefix", "--timeout-ms", "--command-config").contains(name)) {
                throw new IllegalArgumentException("unknown option " + name);
            }
            if (i + 1 >= args.length) {
                throw new IllegalArgumentException(name + " needs a value");
            }
            options.put(name, args[i + 1]);
        }
        for (String required : List.of("--bootstrap-server", "--topic", "--num-records")) {
            if (!options.containsKey(required)) {
                throw new IllegalArgumentException("missing " + required);
            }
        }
        options.putIfAbsent("--num-keys", options.get("--num-records"));
        for (String number : List.of("--num-records", "--num-keys", "--timeout-ms")) {
            try {
                if (Long.parseLong(options.get(number)) < (number.equals("--num-records") ? 0 : 1)) {
                    throw new IllegalArgumentException(number + " out of range: " + options.get(number));
                }
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(number + " is not a number: " + options.get(number));
            }
        }
        return options;
    }

    private static void run(Map<String, String> options) throws Exception {
        String bootstrap = options.get("--bootstrap-server");
        String topic = options.get("--topic");
        int records = Integer.parseInt(options.get("--num-records"));
        int keys = Integer.parseInt(options.get("--num-keys"));
        String prefix = options.get("--key-prefix");
        long timeoutMs = Long.parseLong(options.get("--timeout-ms"));

        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        Properties producerConfig = commandConfig(options);
        producerConfig.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerConfig.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, timeoutMs);  // a send waits that long for the topic's metadata
        KafkaProducer<String, String> producer = new KafkaProducer<>(producerConfig, new StringSerializer(), new StringSerializer());
        try {
            List<Future<RecordMetadata>> sent = new ArrayList<>(records);
            List<ProducerRecord<String, String>> sending = new ArrayList<>(records);
            for (int i = 0; i < records; i++) {
                ProducerRecord<String, String> record = new ProducerRecord<>(topic, prefix + "-" + (i % keys), "value-" + i);
                sending.add(record);
                sent.add(producer.send(record));
            }
            for (int i = 0; i < records; i++) {
                RecordMetadata metadata = sent.get(i).get(remaining(deadline), TimeUnit.NANOSECONDS);
                JsonLines.print("event", "produced", "partition", metadata.partition(), "offset", metadata.offset(),
                        "key", sending.get(i).key(), "value", sending.get(i).value());
            }
        } finally {
            // (a close without a bound would wait out the delivery timeout of sends still pending)
            producer.close(Duration.ofNanos(remaining(deadline)));
        }

        Properties consumerConfig = commandConfig(options);
        consumerConfig.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        consumerConfig.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerConfig, new StringDeserializer(), new StringDeserializer())) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofNanos(remaining(deadline)))) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofNanos(remaining(deadline)));
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            while (true) {
                List<TopicPartition> behind = new ArrayList<>();
                for (TopicPartition partition : partitions) {
                    if (consumer.position(partition, Duration.ofNanos(remaining(deadline))) < ends.get(partition)) {
                        behind.add(partition);
                    }
                }
                if (behind.isEmpty()) {
                    return;
                }
                if (System.nanoTime() > deadline) {
                    throw new TimeoutException("end offsets " + ends + " not reached within " + timeoutMs
                            + " ms by the partitions " + behind);
                }
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    if (record.offset() < ends.get(new TopicPartition(record.topic(), record.partition()))) {
                        JsonLines.print("event", "consumed", "partition", record.partition(), "offset", record.offset(),
                                "key", record.key(), "value", record.value());
                    }
                }
            }
        }
    }

    private static long remaining(long deadline) {
        return Math.max(0, deadline - System.nanoTime());
    }
}
