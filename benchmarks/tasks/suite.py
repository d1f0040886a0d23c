"""Task data of the benchmark suite (``benchmarks/bench_suite.py``): three task types.

* ``json``  -- extraction: a text that states the facts, a JSON schema (5-30 fields, nested
  objects, arrays, enums) and the reference instance (:data:`EXTRACTION_TASKS`); quality is
  exact match of the parsed output with the reference.
* ``code``  -- SQL under ``structgen/grammars/sql.lark`` (a question and the table definitions in the
  prompt, a reference query; quality is execution match on a small SQLite database, plus
  normalised exact match) and Python expressions under ``structgen/grammars/python_expr.lark``
  (quality: the expression's ``ast`` equals the reference's).
* ``prose`` -- one to three plain sentences under a light Lark grammar (:data:`PROSE_GRAMMAR`);
  quality is sentence BLEU against a reference text.

Every task is a plain dict with ``name``, ``type``, ``messages`` (chat messages) and
either ``schema`` or ``grammar`` (Lark text), plus ``answer`` (the reference). Pure data and
prompt builders: importing this module is cheap (no torch, no lark).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["EXTRACTION_TASKS", "SQL_TABLES", "SQL_ROWS", "CODE_TASKS", "PROSE_GRAMMAR", "PROSE_TASKS",
           "extraction_messages", "all_tasks"]


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


S = {"type": "string"}
I = {"type": "integer"}  # noqa: E741
N = {"type": "number"}
B = {"type": "boolean"}


def _enum(*v: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(v)}


def _arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


EXTRACTION_TASKS: list[dict[str, Any]] = [
    {
        "name": "person",
        "text": "Maria Gonzalez is a 34-year-old software engineer living in Madrid, Spain. "
                "Her email is maria.gonzalez@example.com and her phone number is +34 612 345 678. "
                "She speaks Spanish, English and French.",
        "schema": _obj({"name": S, "age": I, "occupation": S, "city": S, "country": S, "email": S,
                        "phone": S, "languages": _arr(S)}),
        "answer": {"name": "Maria Gonzalez", "age": 34, "occupation": "software engineer",
                   "city": "Madrid", "country": "Spain", "email": "maria.gonzalez@example.com",
                   "phone": "+34 612 345 678", "languages": ["Spanish", "English", "French"]},
    },
    {
        "name": "invoice",
        "text": "Invoice INV-2024-0117 was issued on 2024-03-15 by Acme Supplies Ltd to Globex Corporation. "
                "It lists 3 items: 10 boxes of printer paper at 24.99 each, 2 toner cartridges at 89.5 each, "
                "and 5 packs of pens at 7.25 each. The currency is EUR and the invoice is unpaid.",
        "schema": _obj({"invoice_number": S, "date": S, "seller": S, "buyer": S,
                        "items": _arr(_obj({"description": S, "quantity": I, "unit_price": N})),
                        "currency": _enum("EUR", "USD", "GBP"), "paid": B}),
        "answer": {"invoice_number": "INV-2024-0117", "date": "2024-03-15", "seller": "Acme Supplies Ltd",
                   "buyer": "Globex Corporation",
                   "items": [{"description": "printer paper", "quantity": 10, "unit_price": 24.99},
                             {"description": "toner cartridges", "quantity": 2, "unit_price": 89.5},
                             {"description": "pens", "quantity": 5, "unit_price": 7.25}],
                   "currency": "EUR", "paid": False},
    },
    {
        "name": "flight",
        "text": "Booking reference QX7P2L: passenger John Smith flies with Lufthansa flight LH 456 from "
                "Frankfurt (FRA) to New York (JFK) on 2024-07-02, departing 10:35 and arriving 13:05. "
                "Seat 23A in economy class, one checked bag.",
        "schema": _obj({"booking_reference": S, "passenger": S, "airline": S, "flight_number": S,
                        "origin": _obj({"city": S, "airport_code": S}),
                        "destination": _obj({"city": S, "airport_code": S}),
                        "date": S, "departure_time": S, "arrival_time": S, "seat": S,
                        "cabin": _enum("economy", "premium economy", "business", "first"),
                        "checked_bags": I}),
        "answer": {"booking_reference": "QX7P2L", "passenger": "John Smith", "airline": "Lufthansa",
                   "flight_number": "LH 456", "origin": {"city": "Frankfurt", "airport_code": "FRA"},
                   "destination": {"city": "New York", "airport_code": "JFK"}, "date": "2024-07-02",
                   "departure_time": "10:35", "arrival_time": "13:05", "seat": "23A",
                   "cabin": "economy", "checked_bags": 1},
    },
    {
        "name": "product",
        "text": "The Nimbus X200 wireless headphones by SoundWave cost 149.99 USD. They weigh 250 grams, "
                "offer 30 hours of battery life, support Bluetooth 5.3 and come in black, silver and navy. "
                "The product is in stock and has an average rating of 4.6 from 1280 reviews.",
        "schema": _obj({"name": S, "brand": S,
                        "category": _enum("headphones", "speakers", "phones", "laptops"),
                        "price": N, "currency": S, "weight_grams": I, "battery_hours": I,
                        "bluetooth_version": S, "colors": _arr(S), "in_stock": B, "rating": N,
                        "review_count": I}),
        "answer": {"name": "Nimbus X200", "brand": "SoundWave", "category": "headphones", "price": 149.99,
                   "currency": "USD", "weight_grams": 250, "battery_hours": 30, "bluetooth_version": "5.3",
                   "colors": ["black", "silver", "navy"], "in_stock": True, "rating": 4.6,
                   "review_count": 1280},
    },
    {
        "name": "event",
        "text": "The PyData Berlin 2024 conference takes place from 2024-06-12 to 2024-06-14 at the "
                "Berlin Congress Center, Alexanderstrasse 11, 10178 Berlin, Germany. Tickets cost 350 EUR; "
                "the organizer is NumFOCUS and the event is in person. Speakers include Ada Lovelace and "
                "Alan Turing.",
        "schema": _obj({"name": S, "start_date": S, "end_date": S,
                        "venue": _obj({"name": S, "street": S, "postal_code": S, "city": S, "country": S}),
                        "ticket_price": N, "currency": S, "organizer": S,
                        "format": _enum("in person", "online", "hybrid"), "speakers": _arr(S)}),
        "answer": {"name": "PyData Berlin 2024", "start_date": "2024-06-12", "end_date": "2024-06-14",
                   "venue": {"name": "Berlin Congress Center", "street": "Alexanderstrasse 11",
                             "postal_code": "10178", "city": "Berlin", "country": "Germany"},
                   "ticket_price": 350, "currency": "EUR", "organizer": "NumFOCUS", "format": "in person",
                   "speakers": ["Ada Lovelace", "Alan Turing"]},
    },
    {
        "name": "job",
        "text": "Job posting: Senior Data Scientist at Initech in Austin, Texas. Full-time, hybrid work. "
                "Salary between 140000 and 175000 USD per year. Requires 5 years of experience and skills "
                "in Python, SQL and machine learning. Apply by 2024-09-30 at careers@initech.com.",
        "schema": _obj({"title": S, "company": S, "location": _obj({"city": S, "state": S}),
                        "employment_type": _enum("full-time", "part-time", "contract", "internship"),
                        "work_mode": _enum("onsite", "remote", "hybrid"),
                        "salary": _obj({"min": I, "max": I, "currency": S,
                                        "period": _enum("year", "month", "hour")}),
                        "years_experience": I, "skills": _arr(S), "deadline": S, "contact_email": S}),
        "answer": {"title": "Senior Data Scientist", "company": "Initech",
                   "location": {"city": "Austin", "state": "Texas"}, "employment_type": "full-time",
                   "work_mode": "hybrid", "salary": {"min": 140000, "max": 175000, "currency": "USD",
                                                     "period": "year"},
                   "years_experience": 5, "skills": ["Python", "SQL", "machine learning"],
                   "deadline": "2024-09-30", "contact_email": "careers@initech.com"},
    },
    {
        "name": "medical",
        "text": "Patient Robert Chen, born 1975-11-02, has an appointment with Dr. Emily Carter "
                "(cardiology) on 2024-05-20 at 09:30 at Riverside Clinic. Reason: follow-up for "
                "hypertension. Current medications: lisinopril 10 mg and atorvastatin 20 mg. "
                "Insurance provider: BlueShield, policy number BS-99812.",
        "schema": _obj({"patient": _obj({"name": S, "date_of_birth": S}),
                        "doctor": _obj({"name": S, "specialty": S}), "date": S, "time": S, "location": S,
                        "reason": S, "medications": _arr(_obj({"name": S, "dose": S})),
                        "insurance": _obj({"provider": S, "policy_number": S})}),
        "answer": {"patient": {"name": "Robert Chen", "date_of_birth": "1975-11-02"},
                   "doctor": {"name": "Dr. Emily Carter", "specialty": "cardiology"}, "date": "2024-05-20",
                   "time": "09:30", "location": "Riverside Clinic", "reason": "follow-up for hypertension",
                   "medications": [{"name": "lisinopril", "dose": "10 mg"},
                                   {"name": "atorvastatin", "dose": "20 mg"}],
                   "insurance": {"provider": "BlueShield", "policy_number": "BS-99812"}},
    },
    {
        "name": "real_estate",
        "text": "Listing 88213: a 3-bedroom, 2-bathroom apartment at 742 Evergreen Terrace, Springfield, "
                "for sale at 425000 USD. Living area 1450 square feet, built in 1998, with a balcony and "
                "a parking space but no garden. Agent: Lisa Simpson, phone 555-0134.",
        "schema": _obj({"listing_id": S, "property_type": _enum("apartment", "house", "townhouse", "land"),
                        "bedrooms": I, "bathrooms": I, "address": _obj({"street": S, "city": S}),
                        "listing_type": _enum("sale", "rent"), "price": I, "currency": S, "area_sqft": I,
                        "year_built": I, "features": _obj({"balcony": B, "parking": B, "garden": B}),
                        "agent": _obj({"name": S, "phone": S})}),
        "answer": {"listing_id": "88213", "property_type": "apartment", "bedrooms": 3, "bathrooms": 2,
                   "address": {"street": "742 Evergreen Terrace", "city": "Springfield"},
                   "listing_type": "sale", "price": 425000, "currency": "USD", "area_sqft": 1450,
                   "year_built": 1998, "features": {"balcony": True, "parking": True, "garden": False},
                   "agent": {"name": "Lisa Simpson", "phone": "555-0134"}},
    },
    {
        "name": "order",
        "text": "Order #A-55019 placed on 2024-02-03 by customer Priya Patel (customer id C-2231, "
                "priya.patel@example.org). Shipping to 12 Baker Street, London, NW1 6XE, United Kingdom via "
                "express delivery. Items: 1 laptop stand (SKU LS-100) at 39.0, 2 USB-C cables (SKU UC-2M) "
                "at 12.5. Payment by credit card; status shipped.",
        "schema": _obj({"order_id": S, "date": S,
                        "customer": _obj({"name": S, "id": S, "email": S}),
                        "shipping": _obj({"street": S, "city": S, "postal_code": S, "country": S,
                                          "method": _enum("standard", "express", "pickup")}),
                        "items": _arr(_obj({"name": S, "sku": S, "quantity": I, "price": N})),
                        "payment_method": _enum("credit card", "paypal", "bank transfer"),
                        "status": _enum("pending", "shipped", "delivered", "cancelled")}),
        "answer": {"order_id": "A-55019", "date": "2024-02-03",
                   "customer": {"name": "Priya Patel", "id": "C-2231", "email": "priya.patel@example.org"},
                   "shipping": {"street": "12 Baker Street", "city": "London", "postal_code": "NW1 6XE",
                                "country": "United Kingdom", "method": "express"},
                   "items": [{"name": "laptop stand", "sku": "LS-100", "quantity": 1, "price": 39.0},
                             {"name": "USB-C cables", "sku": "UC-2M", "quantity": 2, "price": 12.5}],
                   "payment_method": "credit card", "status": "shipped"},
    },
    {
        "name": "movie",
        "text": "Inception (2010) is a science fiction film directed by Christopher Nolan, running 148 "
                "minutes. It stars Leonardo DiCaprio, Joseph Gordon-Levitt and Elliot Page. It is rated "
                "PG-13, grossed 836.8 million dollars and won 4 Academy Awards.",
        "schema": _obj({"title": S, "year": I, "genre": _enum("science fiction", "drama", "comedy", "horror"),
                        "director": S, "runtime_minutes": I, "cast": _arr(S),
                        "rating": _enum("G", "PG", "PG-13", "R"), "box_office_millions": N,
                        "academy_awards": I}),
        "answer": {"title": "Inception", "year": 2010, "genre": "science fiction",
                   "director": "Christopher Nolan", "runtime_minutes": 148,
                   "cast": ["Leonardo DiCaprio", "Joseph Gordon-Levitt", "Elliot Page"], "rating": "PG-13",
                   "box_office_millions": 836.8, "academy_awards": 4},
    },
]


def extraction_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """Chat messages for an extraction task: instruction with the field list, then the text."""
    keys = ", ".join(task["schema"]["properties"])
    return [
        {"role": "system", "content": "You extract facts from text into JSON. Copy values exactly as "
                                      "written in the text."},
        {"role": "user", "content": f"Extract these fields: {keys}.\nSchema: "
                                    f"{json.dumps(task['schema'], separators=(',', ':'))}\n\n"
                                    f"Text: {task['text']}\n\nJSON:"},
    ]


# ---------------------------------------------------------------------------------------------
# code: SQL (structgen/grammars/sql.lark) and Python expressions (structgen/grammars/python_expr.lark)

SQL_TABLES = """\
CREATE TABLE employees (id INTEGER, name TEXT, department TEXT, salary INTEGER, hire_year INTEGER);
CREATE TABLE departments (name TEXT, budget INTEGER, city TEXT);
CREATE TABLE orders (id INTEGER, customer TEXT, amount REAL, status TEXT, order_date TEXT);"""

SQL_ROWS: dict[str, list[tuple[Any, ...]]] = {
    "employees": [(1, "Alice", "Sales", 72000, 2019), (2, "Bob", "Engineering", 98000, 2021),
                  (3, "Carol", "Sales", 65000, 2022), (4, "Dan", "Marketing", 58000, 2018),
                  (5, "Eve", "Engineering", 105000, 2023), (6, "Frank", "Engineering", 87000, 2020)],
    "departments": [("Sales", 300000, "Boston"), ("Engineering", 900000, "Seattle"),
                    ("Marketing", 200000, "Chicago")],
    "orders": [(1, "Acme", 250.0, "shipped", "2024-01-05"), (2, "Globex", 99.5, "pending", "2024-01-07"),
               (3, "Acme", 40.0, "shipped", "2024-02-11"), (4, "Initech", 310.0, "cancelled", "2024-02-12"),
               (5, "Acme", 15.25, "delivered", "2024-03-01"), (6, "Globex", 120.0, "shipped", "2024-03-09")],
}

_SQL_SYSTEM = ("You translate questions into SQLite queries. Answer with one SQL SELECT query only, "
               "no explanation.")

_SQL = [
    ("sql_filter", "List the names of all employees in the Sales department.",
     "SELECT name FROM employees WHERE department = 'Sales'"),
    ("sql_count", "How many employees were hired after 2020?",
     "SELECT COUNT(*) FROM employees WHERE hire_year > 2020"),
    ("sql_group", "What is the average salary in each department?",
     "SELECT department, AVG(salary) FROM employees GROUP BY department"),
    ("sql_top", "Show the names and salaries of the 3 highest-paid employees.",
     "SELECT name, salary FROM employees ORDER BY salary DESC LIMIT 3"),
    ("sql_sum", "What is the total amount of all shipped orders?",
     "SELECT SUM(amount) FROM orders WHERE status = 'shipped'"),
    ("sql_join", "List each employee's name together with the city of their department.",
     "SELECT employees.name, departments.city FROM employees JOIN departments "
     "ON employees.department = departments.name"),
    ("sql_having", "Which customers have placed more than 2 orders?",
     "SELECT customer FROM orders GROUP BY customer HAVING COUNT(*) > 2"),
    ("sql_distinct", "List the distinct statuses of orders.",
     "SELECT DISTINCT status FROM orders"),
]

_PY_SYSTEM = "You write Python. Answer with one Python expression only, no explanation."

_PY = [
    ("py_range", "The variable nums is a list of integers. Write an expression for the difference between "
                 "its largest and smallest element.", "max(nums) - min(nums)"),
    ("py_sort", "The variable words is a list of strings. Write an expression for the words sorted by "
                "their length.", "sorted(words, key=len)"),
    ("py_discount", "The variable price is a price and rate is a discount in percent. Write an expression "
                    "for the price after the discount.", "price * (1 - rate / 100)"),
    ("py_split", "The variable text is a string. Write an expression that converts it to upper case and "
                 "splits it at commas.", "text.upper().split(',')"),
]


def _sql_task(name: str, question: str, answer: str) -> dict[str, Any]:
    return {"name": name, "type": "code", "lang": "sql", "grammar_name": "sql", "answer": answer,
            "messages": [{"role": "system", "content": _SQL_SYSTEM},
                         {"role": "user", "content": f"Tables:\n{SQL_TABLES}\n\nQuestion: {question}\n"
                                                     f"SQL:"}]}


def _py_task(name: str, question: str, answer: str) -> dict[str, Any]:
    return {"name": name, "type": "code", "lang": "python", "grammar_name": "python_expr",
            "answer": answer,
            "messages": [{"role": "system", "content": _PY_SYSTEM},
                         {"role": "user", "content": f"{question}\nExpression:"}]}


CODE_TASKS: list[dict[str, Any]] = ([_sql_task(*t) for t in _SQL] + [_py_task(*t) for t in _PY])

# ---------------------------------------------------------------------------------------------
# prose: one to three sentences under a light grammar

PROSE_GRAMMAR = r"""// One to three plain sentences separated by single spaces. A sentence starts with a
// capital letter or a digit and ends with . ! or ?; no line breaks, no double quotes and
// no . ! ? inside.
start: SENTENCE (" " SENTENCE)~0..2
SENTENCE: /[A-Z0-9][A-Za-z0-9 ,;:'%$()\/&-]*[.!?]/
"""

_PROSE_SYSTEM = "You are a careful writing assistant. Answer with plain sentences only."

_PROSE = [
    ("prose_fix", "Correct the grammar of this sentence: she go to the market every days and buy fresh "
                  "vegetable.",
     "She goes to the market every day and buys fresh vegetables."),
    ("prose_passive", "Rewrite this sentence in the passive voice: The committee approved the new budget "
                      "on Monday.",
     "The new budget was approved by the committee on Monday."),
    ("prose_summary", "Summarise in one sentence: The city council met on Tuesday to discuss the new park. "
                      "After a long debate, the members voted to build the park next to the river. "
                      "Construction will start in the spring.",
     "The city council voted to build the new park next to the river, and construction will start in "
     "the spring."),
    ("prose_describe", "Write one sentence that describes this product for a shop: wireless headphones, "
                       "30 hours of battery life, black or silver, 250 grams.",
     "These lightweight wireless headphones weigh only 250 grams, offer 30 hours of battery life and "
     "come in black or silver."),
]


def _prose_task(name: str, instruction: str, answer: str) -> dict[str, Any]:
    return {"name": name, "type": "prose", "grammar": PROSE_GRAMMAR, "answer": answer,
            "messages": [{"role": "system", "content": _PROSE_SYSTEM},
                         {"role": "user", "content": instruction}]}


PROSE_TASKS: list[dict[str, Any]] = [_prose_task(*t) for t in _PROSE]


def all_tasks() -> list[dict[str, Any]]:
    """Every task of the suite as a dict with ``name``, ``type`` (json | code | prose),
    ``messages``, ``answer`` and ``schema`` (json) or ``grammar`` / ``grammar_name`` (Lark)."""
    out: list[dict[str, Any]] = []
    for t in EXTRACTION_TASKS:
        out.append({**t, "type": "json", "messages": extraction_messages(t)})
    out.extend(dict(t) for t in CODE_TASKS)
    out.extend(dict(t) for t in PROSE_TASKS)
    return out
