"""An application on psycopg that writes its orders and mwmq's messages in
one transaction (run by sqlsend.rs with the connection string of a role
granted mwmq's functions): what it commits is sent, what it rolls back is
not, a savepoint rolled back takes its message with it."""

import sys

import psycopg

with psycopg.connect(sys.argv[1]) as conn:
    with conn.transaction():
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.execute("SELECT mwmq.send('orders', %s)", ("order 1",))
    try:
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            conn.execute("SELECT mwmq.send('orders', %s)", ("order 2",))
            raise RuntimeError("payment refused")
    except RuntimeError:
        print("order 2 rolled back")
    with conn.transaction():
        conn.execute("INSERT INTO orders VALUES (3)")
        conn.execute("SELECT mwmq.send('orders', %s)", ("order 3",))
        try:
            with conn.transaction():  # a savepoint
                conn.execute("SELECT mwmq.send('orders', %s)", (b"reminder 3",))
                raise RuntimeError("no reminders today")
        except RuntimeError:
            pass
        conn.execute("SELECT mwmq.send('orders', %s::bytea)", (b"invoice 3",))
