package logcompact.clients;

/** The programs' output: one JSON object a line on stdout, from any thread, each line whole. */
final class JsonLines {
    private JsonLines() {
    }

    /** One line of names and values, in their order: strings, numbers, booleans and null as JSON has them. */
    static synchronized void print(Object... namesAndValues) {
        StringBuilder line = new StringBuilder("{");
        for (int i = 0; i < namesAndValues.length; i += 2) {
            if (i > 0) {
                line.append(", ");
            }
            line.append(quote(namesAndValues[i].toString())).append(": ").append(value(namesAndValues[i + 1]));
        }
        System.out.println(line.append('}'));
        System.out.flush();
    }

    private static String value(Object value) {
        if (value == null || value instanceof Number || value instanceof Boolean) {
            return String.valueOf(value);
        }
        return quote(value.toString());
    }

    private static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
