// test_eval_match.c: the answer rules of `varent eval` (host/eval/match.h) on
// hand-written outputs whose verdicts are worked out by hand, and the parsing of
// task lines (host/eval/task.h): what each bad line is told.
#include <string.h>

#include "host/eval/match.h"
#include "host/eval/task.h"
#include "tests/c/check.h"

static eval_item item(const char *answer, eval_match m, int pick_last, int nocase) {
    eval_item it;
    memset(&it, 0, sizeof it);
    it.answer = (char *)answer, it.match = m, it.pick_last = pick_last, it.nocase = nocase;
    return it;
}

static void judge(const char *name, eval_item it, const char *out, int want, const char *want_x) {
    char x[64];
    int got = eval_judge(&it, out, x, sizeof x);
    CHECK(got == want && (!want_x || !strcmp(x, want_x)), name, "'%s' -> %d extracted '%s' (want %d '%s')", out, got, x,
          want, want_x ? want_x : "");
}

static void parse_fails(const char *name, const char *line, const char *needle) {
    eval_item it;
    verr err = { { 0 } };
    int rc = eval_item_parse(&it, line, "t.jsonl", 7, "t", &err);
    CHECK(rc == -1 && strstr(err.msg, needle) && strstr(err.msg, "t.jsonl:7:"), name, "rc %d: %s (want '%s')", rc,
          err.msg, needle);
    if (rc == 0) eval_item_free(&it);
}

int main(void) {
    judge("number_last", item("68", MATCH_NUMBER, 1, 0), "14 + 54 = 68", 1, "68");
    judge("number_first_is_operand", item("68", MATCH_NUMBER, 0, 0), "14 + 54 = 68", 0, "14");
    judge("number_trailing_period", item("68", MATCH_NUMBER, 1, 0), "The answer is 68.", 1, "68");
    judge("number_thousands", item("1207", MATCH_NUMBER, 1, 0), "It is 1,207", 1, "1,207");
    judge("number_list_commas", item("4", MATCH_NUMBER, 1, 0), "3,4", 1, "4");
    judge("number_decimal_first", item("9.9", MATCH_NUMBER, 0, 0), "9.9 is larger than 9.11", 1, "9.9");
    judge("number_decimal_wrong", item("9.9", MATCH_NUMBER, 0, 0), "9.11 is larger than 9.9", 0, "9.11");
    judge("number_equal_value", item("9.9", MATCH_NUMBER, 0, 0), "9.90", 1, "9.90");
    judge("number_negative", item("-3", MATCH_NUMBER, 1, 0), "x = -3", 1, "-3");
    judge("number_none", item("3", MATCH_NUMBER, 1, 0), "three", 0, "");
    judge("number_glued_to_word", item("2", MATCH_NUMBER, 1, 0), "mp3", 0, "");
    judge("exact_trims", item("stone", MATCH_EXACT, 1, 0), "  stone\n", 1, "stone");
    judge("exact_case", item("stone", MATCH_EXACT, 1, 0), "Stone", 0, NULL);
    judge("exact_nocase", item("stone", MATCH_EXACT, 1, 1), "Stone", 1, NULL);
    judge("exact_extra_text", item("stone", MATCH_EXACT, 1, 0), "stone.", 0, NULL);
    judge("contains", item("lamp", MATCH_CONTAINS, 1, 0), "the lamp is", 1, NULL);
    judge("contains_nocase", item("lamp", MATCH_CONTAINS, 1, 1), "The LAMP", 1, NULL);
    judge("contains_no", item("lamp", MATCH_CONTAINS, 1, 0), "The LAMP", 0, NULL);
    const char *re = "(?s)^(?:(?!\\b(?:apple|lamp)\\b).)*?\\bstone\\b";
    judge("regex_first_named", item(re, MATCH_REGEX, 1, 1), "The third item is Stone, not lamp", 1, NULL);
    judge("regex_other_first", item(re, MATCH_REGEX, 1, 1), "lamp, then stone", 0, NULL);
    judge("regex_substring_word", item(re, MATCH_REGEX, 1, 1), "stones", 0, NULL);

    eval_item st = item("68", MATCH_NUMBER, 1, 0);
    st.stop[0] = "\n", st.n_stop = 1;
    judge("stop_cuts_before_rule", st, "68\n70", 1, "68");

    double v;
    CHECK(eval_number_value(" 1,234.5 ", &v) == 0 && v == 1234.5, "number_value", "%g", v);
    CHECK(eval_number_value("12abc", &v) == -1 && eval_number_value("-", &v) == -1, "number_value_rejects", "%s", "accepted");

    eval_item it;
    verr err = { { 0 } };
    int rc = eval_item_parse(&it, "{\"prompt\":\"p\",\"answer\":\"7\",\"match\":\"number\",\"pick\":\"first\",\"stop\":[\"\\n\"]}",
                             "t.jsonl", 1, "dflt", &err);
    CHECK(rc == 0 && !strcmp(it.task, "dflt") && it.match == MATCH_NUMBER && !it.pick_last && it.n_stop == 1, "parse_ok", "%s", err.msg);
    if (rc == 0) eval_item_free(&it);
    rc = eval_item_parse(&it, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"choices\":[\"a\",\"b\"],\"gold\":1}",
                         "t.jsonl", 1, "x", &err);
    CHECK(rc == 0 && it.n_msgs == 1 && it.n_choices == 2 && it.gold == 1, "parse_choices_ok", "%s", err.msg);
    if (rc == 0) eval_item_free(&it);

    parse_fails("bad_json", "{\"prompt\": ", "not valid JSON");
    parse_fails("not_object", "[1,2]", "not a JSON object");
    parse_fails("missing_prompt", "{\"answer\":\"1\"}", "missing \"prompt\"");
    parse_fails("missing_answer", "{\"prompt\":\"p\"}", "missing \"answer\"");
    parse_fails("both_answer_choices", "{\"prompt\":\"p\",\"answer\":\"1\",\"choices\":[\"a\"],\"gold\":0}", "not both");
    parse_fails("unknown_rule", "{\"prompt\":\"p\",\"answer\":\"1\",\"match\":\"fuzzy\"}", "unknown rule 'fuzzy'");
    parse_fails("empty_choices", "{\"prompt\":\"p\",\"choices\":[],\"gold\":0}", "choices: is empty");
    parse_fails("empty_choice_text", "{\"prompt\":\"p\",\"choices\":[\"a\",\"\"],\"gold\":0}", "choices[1]: is empty");
    parse_fails("gold_missing", "{\"prompt\":\"p\",\"choices\":[\"a\"]}", "needs \"gold\"");
    parse_fails("gold_range", "{\"prompt\":\"p\",\"choices\":[\"a\",\"b\"],\"gold\":2}", "gold: must be an index");
    parse_fails("unknown_field", "{\"prompt\":\"p\",\"answr\":\"1\"}", "unknown field \"answr\"");
    parse_fails("number_answer", "{\"prompt\":\"p\",\"answer\":\"ten\",\"match\":\"number\"}", "answer: is not a number");
    parse_fails("bad_regex", "{\"prompt\":\"p\",\"answer\":\"(ab\",\"match\":\"regex\"}", "bad regex");
    parse_fails("pick_not_number", "{\"prompt\":\"p\",\"answer\":\"a\",\"pick\":\"first\"}", "pick: applies only");
    parse_fails("bad_role", "{\"messages\":[{\"role\":\"bot\",\"content\":\"q\"}],\"answer\":\"a\"}", "role 'bot'");
    parse_fails("prompt_not_string", "{\"prompt\":3,\"answer\":\"a\"}", "prompt: must be a string");
    parse_fails("empty_stop", "{\"prompt\":\"p\",\"answer\":\"a\",\"stop\":[\"\"]}", "empty stop");
    CHECK_DONE();
}
